"""onnx2torch converters for ONNX's recurrent operators: LSTM, GRU and RNN.

onnx2torch 1.5.15 has no converter for them. Importing this module registers one for every
version of each operator, after which ``onnx2torch.convert`` turns these nodes into the modules
below::

    import recurrent_converters  # noqa: F401 - registers the converters
    from onnx2torch import convert

    torch_model = convert(onnx_model)

Registration: onnx2torch looks a node's converter up under the ``since_version`` of the
operator's schema at the model's opset, so a converter is registered under each version at which
ONNX defines the operator: LSTM 1, 7, 14, 22; GRU 1, 3, 7, 14, 22; RNN 1, 7, 14, 22. A version the
installed onnx does not define yet is registered all the same (never looked up); one it defines
and this module does not know is warned about (models at that opset then do not convert).

What the modules compute, per direction (t the time step, gates in ONNX's order):

- LSTM (gates i, o, f, c; peepholes P = [Pi, Po, Pf])::

      i = f(clip(Xt Wi' + H Ri' + Wbi + Rbi + Pi * C))
      f = f(clip(Xt Wf' + H Rf' + Wbf + Rbf + Pf * C))     (1 - i with input_forget)
      c = g(clip(Xt Wc' + H Rc' + Wbc + Rbc))
      C' = f * C + i * c
      o = f(clip(Xt Wo' + H Ro' + Wbo + Rbo + Po * C'))
      H' = o * h(C')

- GRU (gates z, r, h)::

      z = f(clip(Xt Wz' + H Rz' + Wbz + Rbz))
      r = f(clip(Xt Wr' + H Rr' + Wbr + Rbr))
      h~ = g(clip(Xt Wh' + (r * H) Rh' + Rbh + Wbh))      linear_before_reset = 0
      h~ = g(clip(Xt Wh' + r * (H Rh' + Rbh) + Wbh))      linear_before_reset = 1
      H' = (1 - z) * h~ + z * H

- RNN: ``H' = f(clip(Xt W' + H R' + Wb + Rb))``.

Where the operator definitions leave room, the choices below are onnxruntime's (the tests compare
with it):

- ``clip`` bounds every gate's pre-activation; the cell state itself is not clipped.
- ``sequence_lens[b] = L`` runs row b over steps 0..L-1 (backwards for a reverse direction); Y is
  0 from step L on, Y_h and Y_c hold the state after the row's last step. A row of length 0 gives
  Y_h = Y_c = 0, not the initial state.
- ``activations`` (any case): Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh,
  HardSigmoid, Elu, Softsign, Softplus. ``activation_alpha`` and ``activation_beta`` are consumed
  in order by the functions that take them; a missing value is the default of the ONNX operator of
  that name (LeakyRelu 0.01, HardSigmoid 0.2 and 0.5, Elu 1, ThresholdedRelu 1, Affine 1 and 0;
  ScaledTanh has none: 1 and 1). onnxruntime differs here: it takes 0 for Affine's,
  ThresholdedRelu's and ScaledTanh's. A bidirectional node lists every function of both
  directions (forward first), or none.
- ThresholdedRelu keeps x where x >= alpha.
- The opset-1 and -3 schemas mean what opset 7's does (R transposed); GRU-1's default direction,
  misspelt "foward", is forward; ``output_sequence`` is ignored.
- ``layout = 1``: X [batch, time, F], states [batch, dirs, H], Y [batch, time, dirs, H].

W, R, B, sequence_lens, initial_h, initial_c and P are all ``forward`` arguments: initializers
(onnx2torch's buffers), graph inputs and computed tensors alike. The time loop is a Python loop:
eager runs take any length; ``torch.jit.trace`` keeps the traced one.

Two details of onnx2torch 1.5.15 shape the modules' interface:

- it resolves a skipped input (``""``) to a node that declares a skipped output, if there is one
  (a node's skipped ``sequence_lens`` would be fed that node's own output), so the converters pass
  only the inputs a node has, and tell the module which slots they fill;
- it indexes a node's result only when the node declares several outputs: a module returns one
  entry per declared output (None for a skipped one), and a lone output bare.
"""
from __future__ import annotations

import warnings
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from onnx import defs
from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription, add_converter
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.utils.common import OnnxMapping, OnnxToTorchModule, OperationConverterResult
from torch import nn

__all__ = ["OnnxGRU", "OnnxLSTM", "OnnxRNN", "KNOWN_VERSIONS", "register"]

# op type -> the versions at which ONNX defines it
KNOWN_VERSIONS = {"LSTM": (1, 7, 14, 22), "GRU": (1, 3, 7, 14, 22), "RNN": (1, 7, 14, 22)}


# -- activations ------------------------------------------------------------------------------

# name -> (function of x, alpha, beta; the defaults of alpha and beta, None where not taken)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: torch.relu(x), None, None),
    "tanh": (lambda x, a, b: torch.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: torch.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: torch.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: torch.where(x >= a, x, torch.zeros_like(x)), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * torch.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: torch.clamp(a * x + b, min=0.0, max=1.0), 0.2, 0.5),
    "elu": (lambda x, a, b: torch.where(x >= 0, x, a * (torch.exp(x) - 1.0)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1.0 + torch.abs(x)), None, None),
    "softplus": (lambda x, a, b: F.softplus(x), None, None),
}


class Activation:
    """One of the recurrent operators' activation functions, its alpha and beta bound."""

    def __init__(self, name: str, alpha: Optional[float] = None, beta: Optional[float] = None):
        self.name = name.lower()
        if self.name not in _ACTIVATIONS:
            raise ValueError(f"unsupported recurrent activation {name!r}; expected one of {sorted(_ACTIVATIONS)}")
        self._function, default_alpha, default_beta = _ACTIVATIONS[self.name]
        self.alpha = default_alpha if alpha is None else float(alpha)
        self.beta = default_beta if beta is None else float(beta)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._function(x, self.alpha, self.beta)

    def __repr__(self) -> str:
        parameters = [f"{k}={v}" for k, v in (("alpha", self.alpha), ("beta", self.beta)) if v is not None]
        return f"{self.name}({', '.join(parameters)})"


def activations_per_direction(names: Sequence[str], alphas: Sequence[float], betas: Sequence[float],
                              defaults: Sequence[str], num_directions: int) -> List[List[Activation]]:
    """The node's functions, one list per direction: ``names`` (all directions', in order) with
    alphas and betas handed out in order to the functions that take them, or ``defaults`` in
    every direction when ``names`` is empty."""
    per_direction = len(defaults)
    names = list(names) or list(defaults) * num_directions
    if len(names) != per_direction * num_directions:
        raise ValueError(f"expected {per_direction * num_directions} activations, got {len(names)}: {names}")
    alphas, betas = iter(alphas), iter(betas)
    functions = []
    for name in names:
        _, default_alpha, default_beta = _ACTIVATIONS.get(str(name).lower(), (None, None, None))
        alpha = next(alphas, None) if default_alpha is not None else None
        beta = next(betas, None) if default_beta is not None else None
        functions.append(Activation(str(name), alpha, beta))
    return [functions[d * per_direction:(d + 1) * per_direction] for d in range(num_directions)]


# -- the modules ------------------------------------------------------------------------------

class _Recurrent(nn.Module, OnnxToTorchModule):
    """What LSTM, GRU and RNN share: inputs, layout, directions, ``sequence_lens``, outputs.
    A subclass gives its gate count, default activations and one step (``_step``)."""

    GATES = 1
    DEFAULT_ACTIVATIONS: Tuple[str, ...] = ("Tanh",)
    HAS_CELL = False
    INPUT_NAMES: Tuple[str, ...] = ("X", "W", "R", "B", "sequence_lens", "initial_h")
    OUTPUT_COUNT = 2

    def __init__(self, hidden_size: Optional[int] = None, direction: str = "forward",
                 activations: Sequence[str] = (), activation_alpha: Sequence[float] = (),
                 activation_beta: Sequence[float] = (), clip: Optional[float] = None, layout: int = 0,
                 outputs: Optional[Sequence[bool]] = None, input_slots: Optional[Sequence[str]] = None):
        """``outputs``: which of the operator's outputs the node declares (all by default);
        ``input_slots``: which inputs ``forward``'s arguments are, in order (all, by default)."""
        super().__init__()
        self.input_slots = tuple(input_slots) if input_slots is not None else self.INPUT_NAMES
        if self.input_slots[:3] != ("X", "W", "R") or not set(self.input_slots) <= set(self.INPUT_NAMES):
            raise ValueError(f"{type(self).__name__}: bad input slots {self.input_slots}")
        direction = "forward" if direction == "foward" else direction  # GRU-1's misspelt default
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ValueError(f"{type(self).__name__}: unknown direction {direction!r}")
        if layout not in (0, 1):
            raise ValueError(f"{type(self).__name__}: unknown layout {layout!r}")
        self.hidden_size = hidden_size
        self.direction = direction
        self.num_directions = 2 if direction == "bidirectional" else 1
        self.clip = None if clip is None else float(clip)
        self.layout = layout
        self.outputs = tuple(bool(o) for o in outputs) if outputs is not None else (True,) * self.OUTPUT_COUNT
        self.activations = activations_per_direction(activations, activation_alpha, activation_beta,
                                                     self.DEFAULT_ACTIVATIONS, self.num_directions)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, direction={self.direction!r}, activations={self.activations}, "
                f"clip={self.clip}, layout={self.layout}")

    def forward(self, *inputs: Optional[torch.Tensor]):
        """The tensors of ``input_slots``, in order (None for an absent optional input). Returns
        Y, Y_h (and Y_c for an LSTM) as declared: None for an output the node skips, and a
        lone declared output bare."""
        if len(inputs) > len(self.input_slots):
            raise TypeError(f"expected at most {len(self.input_slots)} inputs, got {len(inputs)}")
        given = dict(zip(self.input_slots, inputs))
        x, initial_h, initial_c = given["X"], given.get("initial_h"), given.get("initial_c")
        if self.layout == 1:  # to [time, batch, F] and [dirs, batch, H]
            x = x.transpose(0, 1)
            initial_h = None if initial_h is None else initial_h.transpose(0, 1)
            initial_c = None if initial_c is None else initial_c.transpose(0, 1)
        self._check_shapes(given["W"], given["R"])
        lens = given.get("sequence_lens")
        lens = None if lens is None else lens.to(device=x.device, dtype=torch.long).reshape(x.shape[1])
        results = [self._direction(d, x, given, initial_h, initial_c, lens) for d in range(self.num_directions)]
        y = torch.stack([r[0] for r in results], dim=1)  # [time, dirs, batch, H]
        states = [torch.stack([r[i] for r in results], dim=0) for i in range(1, self.OUTPUT_COUNT)]
        if self.layout == 1:
            y = y.permute(2, 0, 1, 3)
            states = [s.transpose(0, 1) for s in states]
        declared = [o if keep else None for o, keep in zip([y] + states, self.outputs)]
        return declared[0] if len(declared) == 1 else tuple(declared)

    def _check_shapes(self, w: torch.Tensor, r: torch.Tensor) -> None:
        if w.shape[0] != self.num_directions:
            raise ValueError(f"direction={self.direction!r} needs W of {self.num_directions} directions, "
                             f"got shape {tuple(w.shape)}")
        if self.hidden_size is not None and r.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden_size={self.hidden_size}, but R has shape {tuple(r.shape)}")

    def _direction(self, d: int, x: torch.Tensor, given: dict, initial_h, initial_c, lens):
        """Direction ``d`` over every step: (Y [time, batch, H], final h[, final c])."""
        w, r, b, p = given["W"][d], given["R"][d], given.get("B"), given.get("P")
        time, batch, hidden = x.shape[0], x.shape[1], r.shape[-1]
        width = self.GATES * hidden
        zeros = torch.zeros(batch, hidden, dtype=x.dtype, device=x.device)
        wb, rb = (b[d][:width], b[d][width:]) if b is not None else (0.0, 0.0)
        h = initial_h[d] if initial_h is not None else zeros
        c = (initial_c[d] if initial_c is not None else zeros) if self.HAS_CELL else None
        projected = torch.matmul(x, w.transpose(0, 1)) + wb  # every step's input term at once
        step = self._step_function(r, rb, None if p is None else p[d], self.activations[d])
        reverse = self.direction == "reverse" or d == 1
        ys = [zeros] * time
        for t in (range(time - 1, -1, -1) if reverse else range(time)):
            new_h, new_c = step(projected[t], h, c)
            if lens is not None:  # rows that ended keep their state, and give Y = 0
                running = (lens > t).unsqueeze(-1)
                new_h = torch.where(running, new_h, h)
                new_c = torch.where(running, new_c, c) if c is not None else None
                ys[t] = torch.where(running, new_h, zeros)
            else:
                ys[t] = new_h
            h, c = new_h, new_c
        if lens is not None:  # a row of length 0 gives zero states
            ran = (lens > 0).unsqueeze(-1)
            h = torch.where(ran, h, zeros)
            c = torch.where(ran, c, zeros) if c is not None else None
        y = torch.stack(ys) if time else x.new_zeros(0, batch, hidden)
        return (y, h) + ((c,) if self.HAS_CELL else ())

    def _clip(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.clip is None else torch.clamp(x, min=-self.clip, max=self.clip)

    def _step_function(self, r: torch.Tensor, rb, p: Optional[torch.Tensor],
                       activations: List[Activation]) -> Callable:
        """One step of one direction: (input term, h, c) -> (new h, new c or None)."""
        raise NotImplementedError


class OnnxLSTM(_Recurrent):
    """ONNX's LSTM, every version (gates i, o, f, c)."""

    GATES = 4
    DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")
    HAS_CELL = True
    INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
    OUTPUT_COUNT = 3

    def __init__(self, *args, input_forget: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_forget = bool(input_forget)

    def _step_function(self, r, rb, p, activations):
        f, g, h_act = activations
        clip = self._clip
        p_i, p_o, p_f = torch.chunk(p, 3, dim=-1) if p is not None else (0.0, 0.0, 0.0)

        def step(x_term, h, c):
            x_i, x_o, x_f, x_c = torch.chunk(x_term + torch.matmul(h, r.transpose(0, 1)) + rb, 4, dim=-1)
            i = f(clip(x_i + p_i * c))
            forget = 1.0 - i if self.input_forget else f(clip(x_f + p_f * c))
            new_c = forget * c + i * g(clip(x_c))
            o = f(clip(x_o + p_o * new_c))
            return o * h_act(new_c), new_c

        return step


class OnnxGRU(_Recurrent):
    """ONNX's GRU, every version (gates z, r, h)."""

    GATES = 3
    DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh")

    def __init__(self, *args, linear_before_reset: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.linear_before_reset = bool(linear_before_reset)

    def _step_function(self, r, rb, p, activations):
        f, g = activations
        clip = self._clip
        r_z, r_r, r_h = torch.chunk(r, 3, dim=0)
        rb_z, rb_r, rb_h = torch.chunk(rb, 3, dim=-1) if isinstance(rb, torch.Tensor) else (0.0, 0.0, 0.0)

        def step(x_term, h, c):
            x_z, x_r, x_h = torch.chunk(x_term, 3, dim=-1)
            z = f(clip(x_z + torch.matmul(h, r_z.transpose(0, 1)) + rb_z))
            reset = f(clip(x_r + torch.matmul(h, r_r.transpose(0, 1)) + rb_r))
            if self.linear_before_reset:
                candidate = x_h + reset * (torch.matmul(h, r_h.transpose(0, 1)) + rb_h)
            else:
                candidate = x_h + torch.matmul(reset * h, r_h.transpose(0, 1)) + rb_h
            return (1.0 - z) * g(clip(candidate)) + z * h, None

        return step


class OnnxRNN(_Recurrent):
    """ONNX's RNN, every version."""

    def _step_function(self, r, rb, p, activations):
        (f,) = activations

        def step(x_term, h, c):
            return f(self._clip(x_term + torch.matmul(h, r.transpose(0, 1)) + rb)), None

        return step


# -- converters and registration --------------------------------------------------------------

_MODULES = {"LSTM": OnnxLSTM, "GRU": OnnxGRU, "RNN": OnnxRNN}
_EXTRA_ATTRIBUTES = {"LSTM": ("input_forget",), "GRU": ("linear_before_reset",), "RNN": ()}


def _list(value) -> list:
    """A repeated attribute as a list (onnx2torch gives an empty one as its raw proto)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def convert_node(node: OnnxNode, graph: OnnxGraph) -> OperationConverterResult:
    """The onnx2torch converter of an LSTM, GRU or RNN node: its module, fed the node's present
    inputs only, declaring the node's outputs as they are."""
    module_type = _MODULES[node.operation_type]
    values = node.input_values
    if len(values) > len(module_type.INPUT_NAMES):
        raise ValueError(f"{node.operation_type} node {node.name!r} has {len(values)} inputs")
    attributes = node.attributes
    clip = attributes.get("clip")
    module = module_type(
        hidden_size=attributes.get("hidden_size"),
        direction=attributes.get("direction", "forward"),
        activations=[str(a) for a in _list(attributes.get("activations"))],
        activation_alpha=[float(a) for a in _list(attributes.get("activation_alpha"))],
        activation_beta=[float(b) for b in _list(attributes.get("activation_beta"))],
        clip=float(clip) if isinstance(clip, (int, float)) else None,
        layout=int(attributes.get("layout", 0)),
        outputs=[name != "" for name in node.output_values],
        input_slots=[slot for slot, value in zip(module_type.INPUT_NAMES, values) if value != ""],
        **{name: int(attributes.get(name, 0)) for name in _EXTRA_ATTRIBUTES[node.operation_type]},
    )
    mapping = OnnxMapping(inputs=tuple(value for value in values if value != ""), outputs=node.output_values)
    return OperationConverterResult(torch_module=module, onnx_mapping=mapping)


def defined_versions(op_type: str) -> List[int]:
    """The versions at which the installed onnx defines ``op_type``."""
    return sorted(schema.since_version for schema in defs.get_all_schemas_with_history()
                  if schema.name == op_type and schema.domain == defs.ONNX_DOMAIN)


def register() -> None:
    """Register ``convert_node`` under every known version of the three operators (once: a second
    call leaves the registry as it is)."""
    for op_type, versions in KNOWN_VERSIONS.items():
        unknown = sorted(set(defined_versions(op_type)) - set(versions))
        if unknown:
            warnings.warn(f"onnx defines {op_type} versions {unknown}, which recurrent_converters does not "
                          f"know: nodes at those versions will not convert", stacklevel=2)
        for version in versions:
            if OperationDescription(defs.ONNX_DOMAIN, op_type, version) not in _CONVERTER_REGISTRY:
                add_converter(operation_type=op_type, version=version)(convert_node)


register()
