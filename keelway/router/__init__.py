"""keelway's router: the HTTP data plane, a process of its own.

Modules, each importing only those listed below it:

    server       the process: arguments, listener, signals, drain; wires the rest
    control      control server: validate -> persist -> swap -> reply
    client       control client (asyncio and blocking) for the control plane and CLI
    control_wire the control protocol's messages
    table_file   the last accepted table on disk
    proxy        shared per-process state: live routing, upstream pools, connections
    downstream   client connections: parse, route, order answers   (hot path)
    exchange     one request/response: links the two halves         (hot path)
    upstream     upstream connections and keep-alive pools          (hot path)
    responses    the router's own answers, pre-rendered
    headers      head rewriting: hop-by-hop, X-Forwarded-*, framing (pure)
    route_table  the table, its wire format and host matching       (pure)

The router imports nothing from the control plane (store, deploy, api): traffic keeps
flowing when the control plane is gone.
"""
