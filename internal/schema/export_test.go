package schema

// Provider exposes goose's provider to the external tests (testdb imports this package,
// so tests that use testdb live in package schema_test).
var Provider = provider
