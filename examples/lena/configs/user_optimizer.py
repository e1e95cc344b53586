"""A user-registered optimizer, runnable from the command line: LENA with Nesterov momentum.

Registering an optimizer is one :func:`examples.optimizers.register` call; a configuration
module is a good place for it, because ``--config`` imports the module before training::

  python -m examples.main --config user_optimizer --set batch_scale=16 --workdir runs/nesterov

(or ``--config path/to/my_config.py`` for a file outside the repository).
"""

import dataclasses

import optax

import optax_lena as ol
from examples import optimizers
from examples.lena.configs import Config


def _lena_nesterov(hp: optimizers.Hyperparams) -> optax.GradientTransformation:
  return ol.lena(
    hp.sample_schedule(),  # the paper's decay on the sample clock, as the built-in LENA
    momentum=hp.momentum,
    nesterov=True,
    weight_decay=hp.weight_decay,
    clock="samples",
    num_samples=hp.num_samples,
    grouping=optimizers.GROUPINGS[hp.grouping],
    **hp.warmup_kwargs(),
  )


# replace=True: --config executes this module on every load.
optimizers.register(
  optimizers.Optimizer(
    name="lena_nesterov",
    build=_lena_nesterov,
    label="LENA (Nesterov)",
    paper_warmup="state_aware",
    diagnostics=True,
    warmups=optimizers.WARMUPS,
  ),
  replace=True,
)


def get_config() -> Config:
  """The default MNIST-1D configuration with ``optimizer='lena_nesterov'``."""
  from examples.lena.configs import default

  return dataclasses.replace(default.get_config(), optimizer="lena_nesterov")
