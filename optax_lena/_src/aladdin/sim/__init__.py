"""The deterministic cluster simulator (public names in ``optax_lena.aladdin.simulator``)."""
