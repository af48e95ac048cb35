"""A second resolution provider, registered by the tests through a test-only distribution."""
