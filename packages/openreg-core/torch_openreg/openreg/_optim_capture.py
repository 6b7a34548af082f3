"""A non-capturable optimizer step is refused in an openreg graph capture, as on CUDA and XPU.

Optimizers whose update reads a step count (Adam, AdamW, NAdam, RAdam, Adamax, RMSprop, Rprop,
ASGD, Adadelta) keep it on the host unless built with ``capturable=True``: the bias
corrections are host numbers, fixed when a step is captured, and every replay would apply the
captured step's corrections again. torch 2.13's
``Optimizer._accelerator_graph_capture_health_check`` (``torch/optim/optimizer.py``), which their
``step()`` calls first, refuses such a step while the current stream captures, but only when the
current accelerator is ``cuda`` or ``xpu``. On openreg it checked nothing: the capture was accepted and its replays gave
wrong parameters without an error (Adam's off by up to 0.04 after four replays, ``state["step"]``
never advancing; hunt36a).

:func:`install` wraps the method: with openreg as the current accelerator it makes the same check,
in torch's words with openreg's name; otherwise torch's method runs as it is. (The method's other
branch, a warning when a capturable optimizer steps outside a capture, never fires: the optimizer's
constructor marks it as given.)
"""

import functools

import torch

_MARK = "_openreg_capture_check_wrapper"


def install() -> None:
    original = torch.optim.Optimizer._accelerator_graph_capture_health_check
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _accelerator_graph_capture_health_check(self) -> None:
        if torch.compiler.is_compiling():  # torch's own rule: compiled steps take the capturable path
            return
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        if accelerator is None or accelerator.type != torch._C._get_privateuse1_backend_name():
            return original(self)
        if torch.accelerator.current_stream().is_capturing() and not all(g["capturable"] for g in self.param_groups):
            raise RuntimeError(
                f"Attempting {accelerator.type.upper()} graph capture of step() for an instance of "
                f"{type(self).__name__} but param_groups' capturable is False."
            )
        return None

    setattr(_accelerator_graph_capture_health_check, _MARK, True)
    torch.optim.Optimizer._accelerator_graph_capture_health_check = _accelerator_graph_capture_health_check
