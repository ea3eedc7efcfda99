// Package clustertest holds no code: its tests kill, restart and partition
// the nodes of private RabbitMQ clusters under the rabbitmq package's
// Publisher, Consumer, Broker and quorum topology (a node killed
// mid-stream, mid-drain, while a quorum tier holds copies; a node cut off
// by a network partition).
//
// They run one after another on one private 3-node cluster (the partition
// test starts one of its own) and take minutes. In a package of their own,
// go test runs them beside the rabbitmq package's tests instead of before
// its parallel ones.
//
//	go test -race -count=1 -v ./rabbitmq/internal/clustertest/
package clustertest
