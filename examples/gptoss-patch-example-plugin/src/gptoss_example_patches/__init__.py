"""An example patch set shipped by another package (docs/plugins.md): one module per patch, each with a SPEC."""
