"""Layer 4: the op table. Importing this package registers every lowering family."""
from . import registry  # noqa: F401
from . import core, random, optim, elementwise, foreach, reductions, histograms, segments, indexing, shape, views, nn, transformer, ctc, grid_sampler, linalg, ldl, fft, quantized  # noqa: F401
from .registry import LOWERINGS, lowering  # noqa: F401
