"""The HTTP face of the server: the app (`app.py`: middleware, routers, the usher's task), its
process (`lifecycle.py`: serve, drain on SIGTERM, exit after every child), the dependencies routes
reach the state through (`dependencies.py`), error responses and body limits, and every route
(`routes/`). It may import everything else in server/; nothing imports it but `server/__main__.py`."""
