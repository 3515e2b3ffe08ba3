// Package adminpb holds the Go code generated from Kagzi's kagzi.v1 protos
// (proto/kagzi/v1): the messages and the AdminService client and server stubs.
//
// The generated files are committed; regenerate them with scripts/genproto (protoc,
// protoc-gen-go and protoc-gen-go-grpc), or `go generate ./admin/adminpb`.
// The server side lives in github.com/kagzi/kagzi/admin.
package adminpb

//go:generate ../../scripts/genproto
