"""The precision of accumulations: sums and averages of low-precision floats are made in float32.

A bfloat16 or float16 running sum loses the small terms once it has grown (bfloat16 keeps 8
significant bits: from 256 times a term on, adding it changes nothing), so the library's sums
and averages of gradients, updates and models widen such values to the dtype
:func:`accumulation_dtype` gives and round back to the values' own dtype only at the end. This
module is the one place that decides how wide. (The cluster simulator's average of the
workers' models is the documented exception: it keeps each leaf's dtype.)
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike


def accumulation_dtype(dtype: DTypeLike) -> np.dtype:
  """The dtype in which to sum or average values of ``dtype``: at least float32.

  Floating dtypes narrower than float32 (bfloat16, float16, the float8 types) give float32;
  float32 and wider floats give themselves (float64 when JAX's x64 mode holds them); integer
  and bool dtypes give float32, the dtype JAX computes a float weight times them in. It is
  ``jnp.promote_types(dtype, jnp.float32)``.

  Args:
    dtype: the dtype of the values accumulated (a NumPy or JAX dtype, or a scalar type).

  Returns:
    The NumPy dtype of the accumulator; cast the result back to ``dtype`` when done.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_lena._src.precision import accumulation_dtype
    >>> accumulation_dtype(jnp.bfloat16), accumulation_dtype(jnp.float32)
    (dtype('float32'), dtype('float32'))
    >>> total, term = jnp.asarray(256, jnp.bfloat16), jnp.asarray(1, jnp.bfloat16)
    >>> float(total + term)  # bfloat16 keeps 8 significant bits: the term is lost
    256.0
    >>> wide = accumulation_dtype(total.dtype)
    >>> float(total.astype(wide) + term.astype(wide))
    257.0
  """
  return np.dtype(jnp.promote_types(dtype, jnp.float32))
