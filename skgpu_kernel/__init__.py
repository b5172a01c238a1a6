"""skgpu_kernel: scikit-learn compatible large-batch kernel machines that adapt to the device."""

from .kernel_machines import AdaptiveKernelClassifier, AdaptiveKernelRegressor

__version__ = "0.1.0"

__all__ = ["AdaptiveKernelClassifier", "AdaptiveKernelRegressor", "__version__"]
