"""The oracle losses, one module each (torch-free at import; formulas on the tensors given).
base.py      Loss (declarations, resolution, labels, TNR rule, formula), Param, class weights
registry.py  register / get / names: the losses by name, their options, misfit checks
ce.py, focal.py, tcp.py, ss.py   the built-in losses, in table order (this file imports them)
Adding a loss: a module here (a registered Loss subclass) and its import below."""
from pipeline.core.losses.base import (CB_BETA, CUSTOM_PREFIX, HEAD_ARCHS, HEADS,  # noqa: F401
                                       WEIGHT_PARAMS, Context, CustomLossError, FunctionLoss, Loss,
                                       LossOptionError, Param, is_custom)
from pipeline.core.losses.registry import (all_params, check_options, flag, get,  # noqa: F401
                                           loss_params, names, option_losses, register,
                                           tnr_logit, tnr_rule, tnr_threshold)
from pipeline.core.losses import ce, focal, tcp, ss  # noqa: F401,E402  (registers them, in order)
