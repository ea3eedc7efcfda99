package sqlstore

import "github.com/jmoiron/sqlx"

// DB is s's database.
func DB(s *Store) *sqlx.DB { return s.db }
