package sqlstate

import (
	"reflect"
	"sync"
)

// chainLimit bounds the errors Of inspects in one chain, so a cyclic
// or absurdly deep chain costs a bounded walk.
const chainLimit = 64

// mysqlShape locates the fields of a MySQL error struct in a type.
type mysqlShape struct {
	ok            bool
	number, state int // field indexes
}

var (
	mysqlShapes sync.Map // reflect.Type → mysqlShape
	uint16Type  = reflect.TypeFor[uint16]()
	state5Type  = reflect.TypeFor[[5]byte]()
)

// mysqlNumberStates are the MySQL/MariaDB error numbers whose meaning the
// SQLSTATE the server reports does not carry — the generic HY000, none (an
// error in the handshake, before the SQLSTATE is negotiated) or, for 1203,
// class 42 — with the SQLSTATE that says what they mean to the rules.
var mysqlNumberStates = map[uint16]string{
	1040: "08004", // ER_CON_COUNT_ERROR: too many connections
	1203: "08004", // ER_TOO_MANY_USER_CONNECTIONS: reported as 42000
	1205: "55P03", // ER_LOCK_WAIT_TIMEOUT: reported as HY000; PostgreSQL's lock_not_available
	1213: "40001", // ER_LOCK_DEADLOCK: MySQL reports 40001 already
	2006: "08S01", // CR_SERVER_GONE_ERROR: a client-library error; go-sql-driver does not return it
	2013: "08S01", // CR_SERVER_LOST: idem
}

// mysqlSQLState reads a go-sql-driver/mysql *MySQLError (or any error whose
// struct has the exported fields Number uint16 and SQLState [5]byte) among
// the first chainLimit errors of err's chain, without importing the driver.
func mysqlSQLState(err error) (string, bool) {
	queue := []error{err}
	for n := 0; len(queue) > 0 && n < chainLimit; n++ {
		e := queue[0]
		queue = queue[1:]
		if e == nil {
			continue
		}
		if number, state, ok := mysqlFields(e); ok {
			return mysqlState(number, state)
		}
		if u, ok := e.(interface{ Unwrap() error }); ok {
			queue = append(queue, u.Unwrap())
		} else if u, ok := e.(interface{ Unwrap() []error }); ok {
			queue = append(queue, u.Unwrap()...)
		}
	}
	return "", false
}

// mysqlState is the SQLSTATE of a MySQL error: the one of its number in
// mysqlNumberStates, else the one it reports; none for an error that
// reports none and has no entry.
func mysqlState(number uint16, state [5]byte) (string, bool) {
	if s, ok := mysqlNumberStates[number]; ok {
		return s, true
	}
	for _, b := range state {
		if (b < '0' || b > '9') && (b < 'A' || b > 'Z') {
			return "", false
		}
	}
	return string(state[:]), true
}

// mysqlFields returns e's Number and SQLState when e is a struct, or a
// pointer to one, of the MySQL error's shape.
func mysqlFields(e error) (uint16, [5]byte, bool) {
	v := reflect.ValueOf(e)
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return 0, [5]byte{}, false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return 0, [5]byte{}, false
	}
	shape := shapeOf(v.Type())
	if !shape.ok {
		return 0, [5]byte{}, false
	}
	return uint16(v.Field(shape.number).Uint()), v.Field(shape.state).Interface().([5]byte), true
}

func shapeOf(t reflect.Type) mysqlShape {
	if s, ok := mysqlShapes.Load(t); ok {
		return s.(mysqlShape)
	}
	shape := mysqlShape{number: -1, state: -1}
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case !f.IsExported() || f.Anonymous:
		case f.Name == "Number" && f.Type == uint16Type:
			shape.number = i
		case f.Name == "SQLState" && f.Type == state5Type:
			shape.state = i
		}
	}
	shape.ok = shape.number >= 0 && shape.state >= 0
	mysqlShapes.Store(t, shape)
	return shape
}
