-- KEYS[1] the run's hash, KEYS[2] the set of runs.
-- ARGV[1] item, ARGV[2] the record (JSON), ARGV[3] mode, ARGV[4] run,
-- ARGV[5] retention in milliseconds (0: none).
-- Modes, as replay.SQLStore's statements:
--   upsert  (Record)   nothing replaces processed or rejected, and only those
--                      replace duplicate (a committed outcome is final); an
--                      empty event id keeps the one there;
--   insert  (Replayed) only where nothing is yet;
--   replace (Records)  the operator's record, keeping the event id and class.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local rec = ARGV[2]
if cur then
  local mode = ARGV[3]
  if mode == 'insert' then
    return 0
  end
  local old = cjson.decode(cur)
  local new = cjson.decode(rec)
  if mode == 'upsert' then
    if old.outcome == 'processed' or old.outcome == 'rejected' then
      return 0
    end
    if old.outcome == 'duplicate' and new.outcome ~= 'processed' and new.outcome ~= 'rejected' then
      return 0
    end
    if new.event_id == nil or new.event_id == '' then
      new.event_id = old.event_id
    end
  else
    new.event_id = old.event_id
    new.class = old.class
  end
  rec = cjson.encode(new)
end
redis.call('HSET', KEYS[1], ARGV[1], rec)
redis.call('SADD', KEYS[2], ARGV[4])
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
