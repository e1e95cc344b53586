"""ALADDIN and its baselines on Ray (public names in ``optax_lena.aladdin.distributed``)."""
