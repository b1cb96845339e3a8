"""Clock controllers: pure logic that turns phase observations into per-phase clock decisions."""
