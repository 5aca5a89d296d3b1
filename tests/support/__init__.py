"""Test support: artefacts, installs, servers and models the tests build (no tests here)."""
