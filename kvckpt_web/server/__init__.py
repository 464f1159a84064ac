"""``kvckpt serve``: the desktop HTTP server of the browser runtime, or of the chat API, an ASGI app (Starlette)
under uvicorn.

Desktop only, and optional: it needs the ``serve`` extra (``pip install 'kvckpt_web[serve]'``). Nothing here
runs in Pyodide, and it does not import the browser side (``kvckpt_web.web``): it serves that package's page
and ES module as files.

* ``static.py``: what is served and from where (an allow-list of routes; nothing else is found);
* ``ranges.py``: byte ranges of a served file, as RFC 9110 defines them;
* ``hosts.py``: the address the server may bind and the ``Host`` names it answers;
* ``app.py``: the ASGI app (routes and the middleware every answer passes through);
* ``run.py``: the listening socket and uvicorn: connection timeouts and limits;
* ``wheel.py``: the kvckpt_web wheel of a source checkout, built at start;
* ``api.py``: ``kvckpt serve --api``, the OpenAI-compatible API over the chat engine, with its bodies
  (``api_body.py``: JSON, bounded in size and time) and errors (``api_errors.py``: OpenAI's shape);
* ``worker.py``: the engine on a thread and event loop of its own, requests run concurrently up to its cache's
  sequences, then queued (bounded).
"""
