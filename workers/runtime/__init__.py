"""Worker runtime: process entry, typed messages, stage servers, tensor channels."""
