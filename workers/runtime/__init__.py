"""Worker runtime: the engine (scheduler, supervisor, records), the worker processes and their stage
handlers, typed messages, and the tensor channels between them."""
