"""ALADDIN internals (asymmetric centralized training, Ko et al., CIKM 2021)."""
