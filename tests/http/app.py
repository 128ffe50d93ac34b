"""The application the HTTP request tests serve, as an ASGI app (uvicorn)
and as a WSGI app (gunicorn). Each path answers one way:

  /ok            200, a short body with Content-Length
  /missing       404
  /fail          500
  /busy          503
  /slow?ms=N     200 after N milliseconds
  /stream?ms=N   200, a chunked body of four parts N milliseconds apart
  /healthz       200 (what kubelet's probes ask)

It is not the code under test: the servers that run it parse HTTP.
"""
import asyncio
import time
from urllib.parse import parse_qs

STATUS = {"/ok": 200, "/missing": 404, "/fail": 500, "/busy": 503, "/healthz": 200}
REASON = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}


def _ms(query):
    values = parse_qs(query).get("ms", ["0"])
    return int(values[0]) / 1000.0


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    path, query = scope["path"], scope["query_string"].decode()
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        for i in range(4):
            await asyncio.sleep(_ms(query))
            await send({"type": "http.response.body", "body": b"part %d\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/slow":
        await asyncio.sleep(_ms(query))
    status = STATUS.get(path, 200 if path == "/slow" else 404)
    body = b"%d\n" % status
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def wsgi(environ, start_response):
    path, query = environ["PATH_INFO"], environ.get("QUERY_STRING", "")
    if path == "/stream":
        # No Content-Length: gunicorn sends HTTP/1.1 chunked.
        start_response("200 OK", [("Content-Type", "text/plain")])

        def parts():
            for i in range(4):
                time.sleep(_ms(query))
                yield b"part %d\n" % i
        return parts()
    if path == "/slow":
        time.sleep(_ms(query))
    status = STATUS.get(path, 200 if path == "/slow" else 404)
    body = b"%d\n" % status
    start_response("%d %s" % (status, REASON[status]),
                   [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
