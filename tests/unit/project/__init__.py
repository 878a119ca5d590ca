"""Unit tests of the repository itself: docs, chart, examples, golden files, CRD schemas, the test plumbing."""
