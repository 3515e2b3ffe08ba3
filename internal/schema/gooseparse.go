package schema

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
)

// This file reads goose SQL migration files the way goose v3 (internal/sqlparser and
// NumericComponent, v3.27.0) reads them, so that the same files mean the same
// statements to kagzi.Migrate and to the goose CLI. Only the Up direction is kept:
// Kagzi never migrates down (the goose CLI does that).

// fileVersion returns the version of a goose migration file, NNNNN_name.sql: the
// number before the first underscore, which must be 1 or more.
func fileVersion(name string) (int64, error) {
	base := path.Base(name)
	if path.Ext(base) != ".sql" {
		return 0, errors.New("migration file does not have the .sql extension")
	}
	before, _, ok := strings.Cut(base, "_")
	if !ok {
		return 0, errors.New("no filename separator '_' found")
	}
	n, err := strconv.ParseInt(before, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("failed to parse version from migration file: %s: %w", base, err)
	}
	if n < 1 {
		return 0, errors.New("migration version must be greater than zero")
	}
	return n, nil
}

// parserState is goose's: where in the file the line being read is.
type parserState int

const (
	stateStart     parserState = iota // before "-- +goose Up"
	stateUp                           // in the Up section
	stateUpBegin                      // in a StatementBegin block of the Up section
	stateUpEnd                        // on the StatementEnd line of such a block
	stateDown                         // in the Down section
	stateDownBegin                    // in a StatementBegin block of the Down section
	stateDownEnd                      // on the StatementEnd line of such a block
)

// goose reads lines of up to 4 MiB.
const maxLineSize = 4 << 20

// parseUp splits the Up section of a goose SQL migration into statements, and
// reports whether the migration runs in a transaction (no "-- +goose NO TRANSACTION").
//
// As goose splits it: outside StatementBegin/StatementEnd blocks a statement ends at a
// line whose last word before any "--" comment ends in ';'; a block is one statement.
// Comment and blank lines before a statement are dropped; once a statement has begun,
// every line up to its end is kept. The Down section is checked for well-formed
// annotations only. ENVSUB annotations, which goose supports, are refused: Kagzi's
// migrations do not use them.
func parseUp(r io.Reader) (stmts []string, useTx bool, err error) {
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 0, 64<<10), maxLineSize)
	state := stateStart
	useTx = true
	var buf strings.Builder
	for scanner.Scan() {
		line := scanner.Text()
		if state == stateStart && strings.TrimSpace(line) == "" {
			continue
		}

		if strings.HasPrefix(strings.TrimSpace(line), "--") && strings.Contains(line, "+goose") {
			cmd, err := extractAnnotation(line)
			if err != nil {
				return nil, false, fmt.Errorf("failed to parse annotation line %q: %w", line, err)
			}
			switch cmd {
			case annotationUp:
				if state != stateStart {
					return nil, false, errors.New("duplicate '-- +goose Up' annotations")
				}
				state = stateUp
				continue
			case annotationDown:
				if state != stateUp && state != stateUpEnd {
					return nil, false, errors.New("must start with '-- +goose Up' annotation")
				}
				if rest := strings.TrimSpace(buf.String()); rest != "" {
					return nil, false, missingSemicolon(rest)
				}
				state = stateDown
				continue
			case annotationStatementBegin:
				switch state {
				case stateUp, stateUpEnd:
					state = stateUpBegin
				case stateDown, stateDownEnd:
					state = stateDownBegin
				default:
					return nil, false, errors.New("'-- +goose StatementBegin' must be defined after '-- +goose Up' or '-- +goose Down' annotation")
				}
				continue
			case annotationStatementEnd:
				switch state {
				case stateUpBegin:
					state = stateUpEnd
				case stateDownBegin:
					state = stateDownEnd
				default:
					return nil, false, errors.New("'-- +goose StatementEnd' must be defined after '-- +goose StatementBegin'")
				}
				// No continue: goose goes on with the StatementEnd line, which ends the block.
			case annotationNoTransaction:
				useTx = false
				continue
			default:
				return nil, false, fmt.Errorf("annotation %q is not supported by Kagzi's migration runner", cmd)
			}
		}

		// Comments and blank lines before a statement are dropped.
		if buf.Len() == 0 && (strings.HasPrefix(strings.TrimSpace(line), "--") || line == "") {
			continue
		}
		if state != stateUpEnd && state != stateDownEnd { // the StatementEnd line itself is not SQL
			buf.WriteString(line)
			buf.WriteString("\n")
		}

		switch state {
		case stateUp:
			if endsWithSemicolon(line) {
				stmts = append(stmts, strings.TrimSpace(buf.String()))
				buf.Reset()
			}
		case stateUpBegin:
		case stateUpEnd:
			stmts = append(stmts, strings.TrimSpace(buf.String()))
			buf.Reset()
			state = stateUp
		case stateDown, stateDownBegin, stateDownEnd:
			buf.Reset()
		default:
			return nil, false, fmt.Errorf("failed to parse migration: unexpected state %d on line %q", state, line)
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, false, fmt.Errorf("failed to scan migration: %w", err)
	}
	switch state {
	case stateStart:
		return nil, false, errors.New("failed to parse migration: must start with '-- +goose Up' annotation")
	case stateUpBegin, stateDownBegin:
		return nil, false, errors.New("failed to parse migration: missing '-- +goose StatementEnd' annotation")
	}
	if rest := strings.TrimSpace(buf.String()); rest != "" {
		return nil, false, missingSemicolon(rest)
	}
	return stmts, useTx, nil
}

type annotation string

const (
	annotationUp             annotation = "Up"
	annotationDown           annotation = "Down"
	annotationStatementBegin annotation = "StatementBegin"
	annotationStatementEnd   annotation = "StatementEnd"
	annotationNoTransaction  annotation = "NO TRANSACTION"
	annotationEnvsubOn       annotation = "ENVSUB ON"
	annotationEnvsubOff      annotation = "ENVSUB OFF"
)

var annotations = []annotation{
	annotationUp, annotationDown, annotationStatementBegin, annotationStatementEnd,
	annotationNoTransaction, annotationEnvsubOn, annotationEnvsubOff,
}

// extractAnnotation reads "-- +goose <annotation>" as goose does: no leading
// whitespace, one "+goose", the annotation's name in any case.
func extractAnnotation(line string) (annotation, error) {
	if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
		return "", errors.New("invalid annotation: leading whitespace")
	}
	cmd := strings.ReplaceAll(line, "--", "")
	cmd = strings.Replace(cmd, "+goose", "", 1)
	if strings.Contains(cmd, "+goose") {
		return "", errors.New("invalid annotation: more than one '+goose'")
	}
	cmd = strings.TrimSpace(cmd)
	if cmd == "" {
		return "", errors.New("empty annotation")
	}
	for _, a := range annotations {
		if strings.EqualFold(string(a), cmd) {
			return a, nil
		}
	}
	return "", fmt.Errorf("invalid annotation: %q not supported", cmd)
}

// endsWithSemicolon reports whether the last word of line before any word starting
// with "--" ends in ';'.
func endsWithSemicolon(line string) bool {
	prev := ""
	for _, word := range strings.Fields(line) {
		if strings.HasPrefix(word, "--") {
			break
		}
		prev = word
	}
	return strings.HasSuffix(prev, ";")
}

func missingSemicolon(rest string) error {
	return fmt.Errorf("failed to parse migration: unexpected unfinished SQL query: %q: missing semicolon?", rest)
}
