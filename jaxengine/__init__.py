"""jaxengine: Temper's JAX post-training engine.

This package's top level imports nothing heavy: ``jaxengine.spec`` and
``jaxengine.data.formats`` are jax-free so that the web process can validate job
specs and dataset formats without importing jax.
"""
__version__ = "0.1.0"
