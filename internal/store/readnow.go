package store

// readNowSQL is the moment a read judges what depends on the time at: a worker's
// silence, a lease's end, a run's wake time. On the primary it is now(). On a hot
// standby (a Config.ReadPool replica) the data may be behind the primary's, and judged
// against the clock a lagging replica takes every live worker for silent and every
// healthy run for stuck past its lease; there it is the commit time of the last
// transaction the standby replayed, the moment its data is current as of, unless the
// standby is current:
//
//   - Its replay is behind what it received (paused, or slow): the replay time.
//   - Its WAL receiver is not streaming (cut off its primary, by a partition or a
//     primary that is down): it replays what it received, then nothing more comes, so
//     the replay time, although receive and replay positions are equal.
//   - It streams and replayed all it received: now(). With the primary idle (every
//     worker dead, no heartbeat committed) the last replayed commit stays behind, and
//     judging by it would keep dead workers ONLINE.
//
// A role without pg_read_all_stats sees the WAL receiver's row (it has one only once
// connected) but not its status: a receiver it sees counts as streaming then. A cut the
// standby has not noticed (packets lost rather than refused) reads as streaming until
// wal_receiver_timeout (60 s by default) ends the connection.
//
// It is a scalar subquery, so PostgreSQL evaluates it once where it is used (an
// InitPlan), and it bounds an index scan as now() does.
const readNowSQL = `(SELECT CASE
	WHEN NOT pg_is_in_recovery() THEN now()
	WHEN pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()
		AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE coalesce(status, 'streaming') = 'streaming')
	THEN now()
	ELSE coalesce(pg_last_xact_replay_timestamp(), now()) END)`
