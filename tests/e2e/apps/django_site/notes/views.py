import os

from django.http import HttpResponse

from notes.models import Note

GREETING = "notes"


def index(request):
    # A query: it fails (500) unless the release command's migrate made the table.
    Note.objects.create(text=request.get_host())
    return HttpResponse(f"{GREETING}: {Note.objects.count()} in {os.environ['KEELWAY_RELEASE']}\n")


def health(request):
    return HttpResponse("ok\n")
