package schema

// UpFS applies the migrations of a file system of the test's (testdb imports this
// package, so tests that use testdb live in package schema_test).
var UpFS = up
