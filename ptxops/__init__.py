"""ptxops: validated, typed CuTeDSL bindings for PTX memory-ordering and multicast instructions."""
from .errors import QualifierError
from . import spec
