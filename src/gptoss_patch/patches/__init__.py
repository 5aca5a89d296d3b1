"""One module per patch; the module name is the patch id. See registry.py."""
