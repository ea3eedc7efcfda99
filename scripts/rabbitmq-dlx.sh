# The dead-lettered-copy resend timeout of the suite's RabbitMQ nodes,
# sourced by services.sh (the shared 3.10 broker) and rabbitmq4.sh (the 4.0
# node); internal/testenv's private nodes use the same value
# (testenv.DeadLetterConfirmTimeout). A quorum queue's dead-letter worker
# whose copy a restarting broker refused sends it again after
# dead_letter_worker_publisher_confirm_timeout: RabbitMQ's default, 180 s,
# made a chaos scenario restarting a broker on quorum queues take 3 minutes
# instead of 10–25 s whenever it fell (docs/reliability.md);
# docs/retry-tiers.md gives operators the same setting. RabbitMQ 3.10's
# rabbitmq.conf has no key for it, hence advanced.config.
#   SLUICE_RABBITMQ_DLX_CONFIRM_TIMEOUT  milliseconds (default 10000)
dlx_confirm_timeout=${SLUICE_RABBITMQ_DLX_CONFIRM_TIMEOUT:-10000}
[[ $dlx_confirm_timeout =~ ^[0-9]+$ ]] || die "SLUICE_RABBITMQ_DLX_CONFIRM_TIMEOUT must be milliseconds, got $dlx_confirm_timeout"
# dlx_advanced_config is the advanced.config that sets it.
dlx_advanced_config="[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, $dlx_confirm_timeout}]}]."
# dlx_eval is the rabbitmqctl eval that reads a running node's value:
# {ok,MS} when set, undefined for RabbitMQ's default.
dlx_eval='application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).'
