"""GPU (or CPU) worker side: models, pipeline stages and the engines that run them."""
