module github.com/kagzi/kagzi/cmd/kagzi

go 1.25.0

require (
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/kagzi/kagzi v0.1.0
	github.com/kagzi/kagzi/admin v0.1.0
	google.golang.org/grpc v1.84.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// The replace directives build the command against this repository's core and admin
// modules during development. `go install github.com/kagzi/kagzi/cmd/kagzi@VERSION`
// refuses a module whose go.mod has replace directives: the commit tagged
// cmd/kagzi/VERSION must drop them (go mod edit -dropreplace=...), requiring the core and
// admin versions tagged with it.
replace (
	github.com/kagzi/kagzi => ../../
	github.com/kagzi/kagzi/admin => ../../admin
)
