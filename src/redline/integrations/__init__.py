"""Training frameworks: callbacks that measure a run of Lightning's ``Trainer``
(:mod:`redline.integrations.lightning`) or Hugging Face's ``Trainer``
(:mod:`redline.integrations.hf`), adapters that turn their models and data into a
:class:`redline.tune.TrainSetup`, and tuning plans exported as their settings.

The framework modules import their framework (optional extras ``redline[lightning]``,
``redline[hf]``); this package and :mod:`~redline.integrations.settings` do not.
"""

from __future__ import annotations

from redline.integrations.errors import IntegrationError, MissingFrameworkError
from redline.integrations.settings import FrameworkSettings, hf_settings, lightning_settings

__all__ = ["FrameworkSettings", "IntegrationError", "MissingFrameworkError", "hf_settings",
           "lightning_settings"]
