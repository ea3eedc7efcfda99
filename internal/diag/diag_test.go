package diag_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/sluicemq/sluice/internal/diag"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"dial amqp://guest:guest@127.0.0.1:5672/: refused":  "dial amqp://guest:xxxxx@127.0.0.1:5672/: refused",
		"postgres://app:s3cr%40t@db:5432/x?sslmode=disable": "postgres://app:xxxxx@db:5432/x?sslmode=disable",
		"host=db user=app password=hunter2 dbname=x":        "host=db user=app password=xxxxx dbname=x",
		`{"user":"a","password":"hunter2"}`:                 `{"user":"a","password":"xxxxx"}`,
		"redis://:pass@localhost:6379/0":                    "redis://:xxxxx@localhost:6379/0",
		"url?api_key=abc123&x=1":                            "url?api_key=xxxxx&x=1",
		"no secrets here: order o-1 not found":              "no secrets here: order o-1 not found",
		"amqp://guest@127.0.0.1/ has no password":           "amqp://guest@127.0.0.1/ has no password",
		"two: amqp://a:b@h1/ and postgres://c:d@h2/":        "two: amqp://a:xxxxx@h1/ and postgres://c:xxxxx@h2/",
	} {
		require.Equal(t, want, diag.Redact(in), in)
	}
	require.Equal(t, "amqp://guest:xxxxx@127.0.0.1:5672/", diag.RedactURL("amqp://guest:guest@127.0.0.1:5672/"))
	require.Equal(t, "amqp://127.0.0.1:5672/", diag.RedactURL("amqp://127.0.0.1:5672/"))
}

func TestSummary(t *testing.T) {
	t.Parallel()
	require.Equal(t, "", diag.Summary(nil, 10))
	long := errors.New(strings.Repeat("é", 1000)) // 2000 bytes
	s := diag.Summary(long, 1024)
	require.LessOrEqual(t, len(s), 1024)
	require.True(t, utf8.ValidString(s))
	require.True(t, strings.HasSuffix(s, "…"))

	s = diag.Summary(errors.New("bad \xff\xfe bytes\x00"), 100)
	require.True(t, utf8.ValidString(s))
	require.NotContains(t, s, "\x00")
	require.Equal(t, "abc", diag.Bound("abc", 3))
	require.Equal(t, "a…", diag.Bound("abcdef", 4))
}

func TestRedactMoreForms(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"host=db password='hunter 2' dbname=x":              "host=db password='xxxxx' dbname=x",
		`host=db password='it\'s secret' user=app`:          `host=db password='xxxxx' user=app`,
		"PGPASSWORD=hunter2 psql -h db":                     "PGPASSWORD=xxxxx psql -h db",
		"env DB_PASSWORD: hunter2":                          "env DB_PASSWORD: xxxxx",
		"Authorization: Bearer eyJhbGciOi.abc-def_ghi":      "Authorization: Bearer xxxxx",
		"authorization=Basic dXNlcjpwYXNz":                  "authorization=Basic xxxxx",
		"sent with bearer abc.DEF-123 to /api":              "sent with bearer xxxxx to /api",
		"amqp://user:p@ss@host:5672/ refused":               "amqp://user:xxxxx@host:5672/ refused",
		`{"Authorization":"Bearer tok123"}`:                 `{"Authorization":"Bearer xxxxx"}`,
		"no secrets: a password policy says nothing at all": "no secrets: a password policy says nothing at all",
	} {
		require.Equal(t, want, diag.Redact(in), in)
	}
}

func TestRedactErrorKeepsTheCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("dial amqp://guest:secret@h/: refused")
	err := diag.RedactError(fmt.Errorf("connecting: %w", cause))
	require.NotContains(t, err.Error(), "secret")
	require.ErrorIs(t, err, cause)

	_, parseErr := url.Parse("amqp://user:pa%sQzK@host/") //nolint:staticcheck // SA1007: the bad escape is the point
	err = diag.RedactError(parseErr)
	require.NotContains(t, err.Error(), "%ss")
	require.NotContains(t, err.Error(), "QzK")
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	require.Nil(t, diag.RedactError(nil))
	require.NotContains(t, diag.RedactURL("amqp://user:pa%sQzK@host/"), "QzK")
}
