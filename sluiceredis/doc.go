// Package sluiceredis is Sluice's one import for Redis: the inbox's store
// (Inbox, NewInbox), which cannot join the business transaction and so
// guarantees less than the SQL one (sluicesql.Inbox): see Inbox.
//
//	inbox, err := sluiceredis.NewInbox(rdb, sluiceredis.InboxConfig{})
//	stage, err := deduplication.New(deduplication.Config{Store: inbox, Consumer: "billing"})
//
// It links go-redis and no SQL driver; importing deduplication alone links
// neither.
package sluiceredis
