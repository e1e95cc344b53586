"""ALADDIN and its baselines on Ray (public names in ``optax_lena.aladdin.distributed``).

Importing the package attaches the iterations of ALADDIN and the baselines to the algorithm
registry, so that a ``Config`` made from any of its modules finds them.
"""

from optax_lena._src.aladdin.ray import iterations as _iterations  # noqa: F401 - attaches them
