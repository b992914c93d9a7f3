"""Model checkpoints: Hugging Face format in and out (``jaxengine.checkpoint.hf``)."""
