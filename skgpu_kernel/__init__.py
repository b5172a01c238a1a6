"""skgpu_kernel: scikit-learn compatible large-batch kernel machines and SGD models that adapt to the device."""

from .kernel_machines import AdaptiveKernelClassifier, AdaptiveKernelRegressor
from .linear_model import BufferedSGDClassifier, BufferedSGDRegressor

__version__ = "0.1.0"

__all__ = [
    "AdaptiveKernelClassifier",
    "AdaptiveKernelRegressor",
    "BufferedSGDClassifier",
    "BufferedSGDRegressor",
    "__version__",
]
