"""A WSGI app whose every path answers 500, as an app with a broken setting does."""


def app(environ, start_response):
    body = b"RuntimeError: DATABASE_URL points at a database that is not there\n"
    start_response("500 Internal Server Error",
                   [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
