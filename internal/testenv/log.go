package testenv

import (
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// LogLine is one line a Log kept.
type LogLine struct {
	Level  string // "error", "info", "debug", "trace"
	Msg    string
	Err    error
	Fields watermill.LogFields
}

// Text is the line's message, error and fields as one string, for
// assertions on what a reader of the log would see.
func (l LogLine) Text() string {
	var b strings.Builder
	b.WriteString(l.Msg)
	if l.Err != nil {
		b.WriteString(": " + l.Err.Error())
	}
	for k, v := range l.Fields {
		fmt.Fprintf(&b, " %s=%v", k, v)
	}
	return b.String()
}

// Log is a Watermill logger that keeps every line, safe to read while
// lines arrive (watermill's CaptureLoggerAdapter hands out its map).
type Log struct {
	mu     *sync.Mutex
	lines  *[]LogLine
	fields watermill.LogFields
}

// NewLog returns an empty Log.
func NewLog() *Log { return &Log{mu: &sync.Mutex{}, lines: &[]LogLine{}} }

func (l *Log) add(level, msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.lines = append(*l.lines, LogLine{Level: level, Msg: msg, Err: err, Fields: l.fields.Add(fields)})
}

// Error keeps an error line.
func (l *Log) Error(msg string, err error, fields watermill.LogFields) {
	l.add("error", msg, err, fields)
}

// Info keeps an info line.
func (l *Log) Info(msg string, fields watermill.LogFields) { l.add("info", msg, nil, fields) }

// Debug keeps a debug line.
func (l *Log) Debug(msg string, fields watermill.LogFields) { l.add("debug", msg, nil, fields) }

// Trace keeps a trace line.
func (l *Log) Trace(msg string, fields watermill.LogFields) { l.add("trace", msg, nil, fields) }

// With returns a Log adding fields to its lines, keeping them in l.
func (l *Log) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &Log{mu: l.mu, lines: l.lines, fields: l.fields.Copy().Add(fields)}
}

// Lines returns the lines kept so far whose message contains msg ("" for
// every line).
func (l *Log) Lines(msg string) []LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LogLine
	for _, line := range *l.lines {
		if strings.Contains(line.Msg, msg) {
			out = append(out, line)
		}
	}
	return out
}
