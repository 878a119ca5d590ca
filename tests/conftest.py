"""The root of every test tier: it loads the one fixtures layer (tests/fixtures) for all of them."""

pytest_plugins = ["fixtures.tiers", "fixtures.cluster", "fixtures.skips", "fixtures.golden"]
