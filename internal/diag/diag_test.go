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

// TestRedactSecretKeys: the key forms real errors carry — a secret word
// inside a longer key (access_token, client_secret, GITHUB_TOKEN,
// aws_secret_access_key), JSON, YAML and env-var forms — and URL userinfo
// with a quote in the password (issue 18, item 10).
func TestRedactSecretKeys(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"POST /oauth?access_token=ya29.AbC&x=1 failed":        "POST /oauth?access_token=xxxxx&x=1 failed",
		"client_secret=GOCSPX-abc123 rejected":                "client_secret=xxxxx rejected",
		"aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfi":  "aws_secret_access_key=xxxxx",
		"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI":                 "AWS_SECRET_ACCESS_KEY=xxxxx",
		"env GITHUB_TOKEN=ghp_16C7e42F292c6912E7710c8 set":    "env GITHUB_TOKEN=xxxxx set",
		"MYSQL_PWD=hunter2 mysql -h db":                       "MYSQL_PWD=xxxxx mysql -h db",
		`response {"refresh_token":"1//0gLm-xyz","ok":false}`: `response {"refresh_token":"xxxxx","ok":false}`,
		`{"token_type":"bearer", "id_token" : "eyJ.x.y"}`:     `{"token_type":"xxxxx", "id_token" : "xxxxx"}`,
		"ssh: passphrase=correct-horse battery":               "ssh: passphrase=xxxxx battery",
		"session_token=FwoGZXIvYXdzE":                         "session_token=xxxxx",
		"private_key=MIIEvQIBADANBg":                          "private_key=xxxxx",
		"PRIVATE-KEY: MIIEvQIBADANBg":                         "PRIVATE-KEY: xxxxx",
		"x-api-key: abc123 denied":                            "x-api-key: xxxxx denied",
		"apikey=abc123":                                       "apikey=xxxxx",
		"spring.datasource.password=hunter2":                  "spring.datasource.password=xxxxx",
		"db_credentials: s3cr3t":                              "db_credentials: xxxxx",
		"user=app pass=hunter2 host=db":                       "user=app pass=xxxxx host=db",
		"X-Amz-Signature=abcdef0123&X-Amz-Date=1":             "X-Amz-Signature=xxxxx&X-Amz-Date=1",
		"password=s3'cret8 next":                              "password=xxxxx next",
		`body: {"refresh_token":"1//0gLm"}`:                   `body: {"refresh_token":"xxxxx"}`,
		"dial amqp://u:s3'cret8@h:5672/: refused":             "dial amqp://u:xxxxx@h:5672/: refused",
		`dial "amqp://u:s3"cr'et@h/" refused`:                 `dial "amqp://u:xxxxx@h/" refused`,
		"amqp://u:p@ss@h1:5672/ and more":                     "amqp://u:xxxxx@h1:5672/ and more",
		"amqp://u:ab/cd+e=f@h/ refused":                       "amqp://u:xxxxx@h/ refused",
		"amqp://u:a:b@h/":                                     "amqp://u:xxxxx@h/",
		// Words in prose are not keys.
		"no secrets: a password policy says nothing at all": "no secrets: a password policy says nothing at all",
		"tokens: 5 used, compass: north, bypass: on":        "tokens: 5 used, compass: north, bypass: on",
		// Issue 44, item 6: the word "pass" in prose, an argument's name
		// after it; "pass" as a key is still one.
		"declaration with other arguments pass: x-queue-type cannot be set": "declaration with other arguments pass: x-queue-type cannot be set",
		`{"user":"app","pass":"hunter2"}`:                                   `{"user":"app","pass":"xxxxx"}`,
		"user=app pass = hunter2":                                           "user=app pass = xxxxx",
		"db_pass: hunter2":                                                  "db_pass: xxxxx",
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

// An http.Client's *url.Error keeps its Op and its cause (connection
// refused), with only the URL's password replaced; before, every *url.Error
// became "not a valid URL".
func TestRedactErrorKeepsARequestsCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	err := diag.RedactError(fmt.Errorf("listing the queues: %w", &url.Error{Op: "Get", URL: "http://admin:s3cret@127.0.0.1:1/api/queues/%2F", Err: cause}))
	require.Equal(t, `listing the queues: Get http://admin:xxxxx@127.0.0.1:1/api/queues/%2F: dial tcp 127.0.0.1:1: connect: connection refused`, err.Error())
	require.ErrorIs(t, err, cause)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
}
