package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kagzi/kagzi/internal/committer"
)

// Statements with many parameters are written with named ones (@run_id, not $1) and
// declare, in one list, each name with its SQL type and how to read it from the
// statement's Go input. The names are turned into positions once, when the package
// loads; running a statement costs no more than positional arguments do (pgx's
// NamedArgs rewrites the SQL at every call: 27 µs and 215 allocations for a
// statement of this size).

// param is a named parameter of a statement whose input is a W: its name, its SQL
// type, and how to read its value from one input, or an array of values from many
// (see setWrite).
type param[W any] struct {
	name, typ string
	one       func(W) any
	many      func([]W) any
}

// arg declares a parameter: get reads its value from an input.
func arg[W, V any](name, typ string, get func(W) V) param[W] {
	return param[W]{name: name, typ: typ,
		one: func(w W) any { return pgValue(get(w)) },
		many: func(ws []W) any {
			vs := make([]V, len(ws))
			for i, w := range ws {
				vs[i] = get(w)
			}
			return pgValue(vs)
		}}
}

// pgValue hands pgx a uuid.UUID as the [16]byte it is. pgx has no plan for the
// named type: it encoded it through its driver.Valuer (formatting it as text and
// parsing that back), or through reflection, allocating at each value, and at each
// element of an array. A slice becomes an array parameter whose elements are read
// through pointers (see pgArray).
func pgValue(v any) any {
	switch x := v.(type) {
	case uuid.UUID:
		return [16]byte(x)
	case *uuid.UUID:
		if x == nil {
			return nil
		}
		return [16]byte(*x)
	}
	return pgArray(v)
}

// pgArray returns a slice of the types the set-based statements' parameters have as
// a ptrArray of the pgtype values they are, and any other value as it is. pgx
// encodes an array element by element, each handed over as an interface value: a
// [16]byte, a string, a time.Time or an int64 put in one is copied to the heap (an
// allocation an element, a dozen a run's end), a pointer is not. Nil pointers
// become NULL elements, as before; ints are range-checked by the column's codec.
func pgArray(v any) any {
	uuidOf := func(u [16]byte) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }
	textOf := func(s string) pgtype.Text { return pgtype.Text{String: s, Valid: true} }
	timeOf := func(t time.Time) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t, Valid: true} }
	int8Of := func(n int64) pgtype.Int8 { return pgtype.Int8{Int64: n, Valid: true} }
	switch x := v.(type) {
	case []pgtype.UUID:
		return ptrArray[pgtype.UUID](x)
	case [][16]byte:
		return mapArray(x, uuidOf)
	case []uuid.UUID:
		return mapArray(x, func(u uuid.UUID) pgtype.UUID { return uuidOf(u) })
	case []*uuid.UUID:
		return mapNullable(x, func(u uuid.UUID) pgtype.UUID { return uuidOf(u) })
	case []string:
		return mapArray(x, textOf)
	case []*string:
		return mapNullable(x, textOf)
	case []time.Time:
		return mapArray(x, timeOf)
	case []*time.Time:
		return mapNullable(x, timeOf)
	case []int64:
		return mapArray(x, int8Of)
	case []*int64:
		return mapNullable(x, int8Of)
	case []int:
		return mapArray(x, func(n int) pgtype.Int8 { return int8Of(int64(n)) })
	case []*int:
		return mapNullable(x, func(n int) pgtype.Int8 { return int8Of(int64(n)) })
	case []int32:
		return mapArray(x, func(n int32) pgtype.Int8 { return int8Of(int64(n)) })
	case []*int32:
		return mapNullable(x, func(n int32) pgtype.Int8 { return int8Of(int64(n)) })
	case []bool:
		return mapArray(x, func(b bool) pgtype.Bool { return pgtype.Bool{Bool: b, Valid: true} })
	}
	return v
}

// mapNullable is mapArray for pointers: a nil one becomes T's zero value, which
// pgtype's types encode as NULL.
func mapNullable[V, T any](vs []*V, f func(V) T) any {
	return mapArray(vs, func(p *V) T {
		if p == nil {
			var null T
			return null
		}
		return f(*p)
	})
}

// mapArray converts each element of vs with f, into a ptrArray (nil stays a NULL array).
func mapArray[V, T any](vs []V, f func(V) T) any {
	if vs == nil {
		return ptrArray[T](nil)
	}
	a := make(ptrArray[T], len(vs))
	for i, v := range vs {
		a[i] = f(v)
	}
	return a
}

// ptrArray is a one-dimensional array parameter whose elements pgx reads through
// pointers (pgtype.ArrayGetter): *T implements T's valuer interface (UUIDValuer,
// TextValuer...), so no element is copied into an interface value.
type ptrArray[T any] []T

// Dimensions returns the array's one dimension, or nil (NULL) for a nil slice.
func (a ptrArray[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index returns a pointer to element i.
func (a ptrArray[T]) Index(i int) any { return &a[i] }

// IndexType returns a value of the type Index returns.
func (a ptrArray[T]) IndexType() any { return new(T) }

// namedStatement is SQL written with @name parameters, rewritten to $n positions.
type namedStatement[W any] struct {
	sql    string
	params []param[W]
}

// named rewrites sql's @name parameters to the positions of params (each must be
// used, and no other may be). A mistake panics when the package loads, so no test
// can miss it.
func named[W any](sql string, params ...param[W]) namedStatement[W] {
	pos := map[string]int{}
	for i, p := range params {
		pos[p.name] = i + 1
	}
	return namedStatement[W]{sql: rewriteNamed(sql, pos), params: params}
}

// args returns the statement's arguments for the input w, in position order.
func (s namedStatement[W]) args(w W) []any {
	values := make([]any, len(s.params))
	for i, p := range s.params {
		values[i] = p.one(w)
	}
	return values
}

// rewriteNamed replaces the @name parameters of sql (outside quoted strings,
// quoted identifiers and comments) with $n, n = pos[name]. It panics on a name pos
// lacks and on a name of pos that sql never uses.
func rewriteNamed(sql string, pos map[string]int) string {
	var b strings.Builder
	used := map[string]bool{}
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(sql[i+1:], c)
			if j < 0 {
				panic("store: unterminated quote in statement: " + sql)
			}
			b.WriteString(sql[i : i+j+2])
			i += j + 2
		case c == '-' && strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				j = len(sql) - i
			}
			b.WriteString(sql[i : i+j])
			i += j
		case c == '@' && i+1 < len(sql) && isNameByte(sql[i+1]):
			j := i + 1
			for j < len(sql) && isNameByte(sql[j]) {
				j++
			}
			name := sql[i+1 : j]
			n, ok := pos[name]
			if !ok {
				panic(fmt.Sprintf("store: statement uses @%s, which it does not declare: %s", name, sql))
			}
			used[name] = true
			b.WriteString("$" + strconv.Itoa(n))
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	for name := range pos {
		if !used[name] {
			panic(fmt.Sprintf("store: statement declares @%s but does not use it: %s", name, sql))
		}
	}
	return b.String()
}

func isNameByte(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// setWrite is a fenced write that takes one input or many at once, with one SQL body
// for both, so that the write of one run and the merged write of many can never
// fence (or do) differently. The body reads its inputs from the relation "i": one
// row per input, with a column per parameter and ord, the input's 1-based index.
// Its result rows lead with ord. For one input, i is a row of scalar parameters;
// for many, the parameters are arrays that unnest into the rows of i.
type setWrite[W any] struct {
	stmt   committer.Statement
	one    string
	many   string
	params []param[W]
}

// newSetWrite builds a set write whose statement starts with "WITH i AS (...), "
// and goes on with body.
func newSetWrite[W any](name, body string, params ...param[W]) *setWrite[W] {
	return newSetWriteOf(name, func(bool) string { return body }, params...)
}

// newSetWriteOf is newSetWrite with a body that may end differently for one input
// and for many (body(many)): only in what does not fence, such as how a merged
// statement batches its notifications.
func newSetWriteOf[W any](name string, body func(many bool) string, params ...param[W]) *setWrite[W] {
	s := &setWrite[W]{params: params}
	ones, arrays, cols := make([]string, len(params)), make([]string, len(params)), make([]string, len(params))
	for i, p := range params {
		n := "$" + strconv.Itoa(i+1)
		ones[i] = n + "::" + p.typ + " AS " + p.name
		arrays[i] = n + "::" + p.typ + "[]"
		cols[i] = p.name
	}
	s.one = "WITH i AS (SELECT " + strings.Join(ones, ", ") + ", 1::bigint AS ord), " + body(false)
	s.many = "WITH i AS (SELECT * FROM unnest(" + strings.Join(arrays, ", ") + ") WITH ORDINALITY AS i(" +
		strings.Join(cols, ", ") + ", ord)), " + body(true)
	s.stmt = committer.Statement{Name: name, Build: s.build}
	return s
}

// build is the committer.Statement's Build: inputs are the W of each request.
func (s *setWrite[W]) build(inputs []any) (string, []any) {
	values := make([]any, len(s.params))
	if len(inputs) == 1 {
		w := inputs[0].(W)
		for i, p := range s.params {
			values[i] = p.one(w)
		}
		return s.one, values
	}
	ws := make([]W, len(inputs))
	for i, in := range inputs {
		ws[i] = in.(W)
	}
	for i, p := range s.params {
		values[i] = p.many(ws)
	}
	return s.many, values
}

// Writer sends set writes: a *committer.Committer shares them among runs and
// commits; Direct sends each on its own.
type Writer interface {
	Write(ctx context.Context, s *committer.Statement, input any, dest ...any) error
}

// Direct is a Writer that sends every write alone on db, in its own round trip.
func Direct(db DBTX) Writer { return direct{db} }

type direct struct{ db DBTX }

func (d direct) Write(ctx context.Context, s *committer.Statement, input any, dest ...any) error {
	sql, values := s.Build([]any{input})
	return committer.ReadOne(d.db.QueryRow(ctx, sql, values...), dest)
}

// write sends one input of a set write through w and scans its row into dest
// (pgx.ErrNoRows when the statement returned none for it).
func write[W any](ctx context.Context, w Writer, s *setWrite[W], input W, dest ...any) error {
	return w.Write(ctx, &s.stmt, input, dest...)
}
