"""The provider's version, read by setup.cfg and by get_provider_info()."""

__version__ = "0.1.0"
