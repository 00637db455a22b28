"""The activator's control-plane side: the idle sweep that parks instances (scale to
zero). Parking and waking themselves are operations (keelway/deploy/parking.py); the
router holds requests to a parked route and asks for the wake."""
