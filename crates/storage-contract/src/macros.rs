//! The macros that expand the checks into tests, one `#[tokio::test]` per check named after
//! it. Every check of the suite is listed here exactly once (a unit test of the crate checks
//! that none is left out).

/// Expands every check that any adapter must pass into one test each. `$factory` is an
/// expression making a [`crate::StoreFactory`]; it is evaluated once per test.
#[macro_export]
macro_rules! storage_contract_tests {
    ($factory:expr) => {
        $crate::__storage_contract_checks!(
            $factory;
            batches::batch_files_are_listed_oldest_first_per_client_and_paged_i7,
            batches::files_are_listed_in_either_order_and_paged_past_the_cursor,
            batches::a_file_an_unfinished_batch_reads_is_in_use_until_the_batch_ends,
            batches::starting_a_batch_creates_every_kept_line_as_a_queued_task_p2,
            batches::a_batch_cancelled_while_validating_starts_nothing_p2,
            batches::kept_lines_whose_custom_id_an_earlier_kept_line_has_are_found,
            batches::each_batch_line_counts_once_when_its_task_ends,
            batches::a_batch_line_recovery_fails_counts_as_failed_p7,
            batches::a_batch_step_is_a_compare_and_set_on_its_status,
            batches::a_batch_ends_with_its_files_and_keeps_its_errors,
            batches::batch_tasks_page_in_line_order_and_filter_by_status,
            batches::batch_answers_pair_each_line_with_its_response,
            batches::batches_are_listed_newest_first_per_client_i7,
            batches::purging_batches_removes_only_ended_ones_with_their_tasks_and_files_p5_p6,
            batches::purging_finished_tasks_leaves_batch_tasks_to_their_batch_p5,
            batches::batch_lines_do_not_count_toward_the_queue_limits,
            cancel::a_cancel_follows_the_table_in_every_status_p4,
            cancel::after_an_accepted_cancel_the_worker_can_only_acknowledge_it_p4_i3,
            cancel::a_cancel_for_a_client_finds_only_that_clients_tasks_i7,
            cancel::delete_finished_removes_only_a_finished_task_of_the_client_p6,
            clients::clients_are_found_by_token_hash_until_revoked_and_listed_oldest_first_i7,
            clients::lookups_made_at_once_each_answer_their_own_i7,
            clients::a_pairing_code_pairs_one_client_once_before_it_expires,
            clients::a_code_that_does_not_grant_the_scopes_asked_for_is_kept,
            clients::the_fifth_wrong_code_within_ten_minutes_burns_every_code_and_locks_pairing,
            clients::wrong_codes_older_than_ten_minutes_do_not_count,
            clients::initialize_stores_the_identity_and_the_admin_client_once,
            concurrency::concurrent_claimers_take_each_task_once,
            concurrency::a_cancel_racing_a_completion_has_one_winner_p4_i3,
            concurrency::racing_appends_at_one_sequence_number_apply_once_p3,
            concurrency::racing_claims_of_one_key_let_one_proceed_i8,
            idempotency::a_claimed_key_is_in_use_then_replays_its_reply_i8,
            idempotency::a_released_pending_key_is_free_again_i8,
            idempotency::a_pending_hold_that_ran_out_frees_its_key_i8,
            idempotency::an_expired_record_is_no_record_i8,
            idempotency::keys_are_scoped_by_client_and_operation_i8,
            idempotency::a_model_registers_with_its_keys_reply_in_one_transaction_i8,
            idempotency::a_settled_key_keeps_its_final_reply_after_its_task_is_purged_i8,
            idempotency::a_key_settles_only_while_it_keeps_the_reply_that_was_read_i8,
            listener::the_listener_hears_each_committed_event_once_in_log_order,
            listener::a_write_that_commits_nothing_tells_no_event,
            listener::every_transaction_is_measured,
            models::a_model_is_registered_once_and_listed_by_id_p1,
            models::a_model_id_with_slashes_reads_and_deletes,
            models::a_deleted_models_file_is_not_found_again_at_startup,
            models::a_rehashed_fingerprint_replaces_the_stored_one,
            reads::a_task_reads_back_by_id_and_by_response_id_in_every_status,
            reads::list_tasks_filters_by_client_status_model_and_age_newest_first,
            reads::events_page_through_a_log_after_a_sequence_number,
            reads::count_by_status_counts_the_tasks_in_each_status,
            reads::cancelling_tasks_lists_the_cancelling_tasks_of_one_owner,
            recovery::an_instance_registers_renews_its_lease_and_is_stopped_once_it_retires,
            recovery::a_lone_registered_instance_leads_the_maintenance,
            recovery::recovery_moves_every_leftover_task_per_the_table_p7_p8_p9_p10_p11_i5,
            recovery::a_second_recovery_changes_nothing_i5,
            recovery::a_requeued_task_closes_its_open_item_as_incomplete_and_its_next_run_opens_a_new_one,
            recovery::a_resumed_task_continues_its_open_item,
            recovery_oracle::recovery_writes_exactly_what_the_domain_decides_for_each_task_p11_i5,
            retention::a_purge_removes_only_finished_tasks_older_than_the_cutoff_p5_p6_i4,
            retention::a_purge_in_batches_of_one_takes_the_oldest_first_until_none_is_left_i4,
            retention::purging_idempotency_records_removes_only_expired_ones_in_batches_i8,
            tasks::a_created_task_is_queued_with_its_created_event_at_sequence_one_p2_i1,
            tasks::a_task_commits_with_its_idempotency_record_and_a_second_create_under_the_key_writes_nothing_i8,
            tasks::creating_a_task_whose_id_exists_fails_and_changes_nothing,
            tasks::claim_next_takes_the_oldest_queued_task_and_makes_the_claimer_its_owner,
            schedule::claims_take_the_most_urgent_tier_first,
            schedule::a_task_that_waited_an_aging_period_moves_up_a_tier,
            schedule::within_a_tier_the_client_with_fewer_running_tasks_goes_first,
            schedule::equal_loads_take_turns_by_the_client_served_least_recently,
            schedule::a_requeued_task_keeps_its_tier,
            schedule::client_limits_are_set_and_replaced,
            schedule::a_client_past_its_max_queued_creates_nothing,
            schedule::a_create_past_the_services_max_queued_creates_nothing,
            schedule::creates_made_at_once_fill_a_queue_to_its_limit_and_no_further,
            schedule::a_client_at_its_max_running_waits_while_others_run,
            schedule::the_claim_order_holds_after_every_write_path_moved_the_fronts,
            schedule::claims_follow_next_claim_over_the_heads_through_random_writes,
            schedule::aged_heads_go_first_whether_or_not_their_clients_have_a_max_running,
            steps::appended_steps_number_their_events_after_the_last_and_move_the_task_p3_i2,
            steps::a_refused_step_writes_nothing_of_its_batch_p3,
            steps::an_append_at_a_stale_sequence_number_is_refused_as_stale,
            steps::a_step_by_an_instance_that_does_not_own_the_task_is_refused,
            steps::steps_on_an_unknown_task_find_nothing,
            output::the_first_output_of_a_run_opens_its_item_and_later_outputs_are_deltas_of_it,
            output::a_snapshot_is_stored_with_its_output_and_replaced_by_the_next,
            output::completing_stores_the_response_drops_the_snapshot_and_closes_the_item_p3,
            output::a_completion_without_output_opens_and_closes_its_item,
            output::a_failure_stores_its_error_and_drops_the_snapshot,
            webhooks::webhook_endpoints_are_stored_listed_newest_first_rewritten_and_removed,
            webhooks::a_background_response_that_ends_records_one_webhook_delivery_per_subscribed_endpoint,
            webhooks::a_batch_that_ends_records_one_webhook_delivery_per_subscribed_endpoint,
            webhooks::recovery_that_fails_a_background_response_records_its_webhook_delivery_p7,
            webhooks::claimed_webhook_deliveries_are_leased_per_endpoint_until_their_lease_runs_out,
            webhooks::a_recorded_webhook_attempt_is_stored_and_ends_the_lease,
            webhooks::removing_a_webhook_endpoint_removes_its_deliveries,
        );
    };
}

/// Expands the checks for adapters that implement [`crate::SingleProcess`].
#[macro_export]
macro_rules! storage_contract_single_process_tests {
    ($factory:expr) => {
        $crate::__storage_contract_checks!(
            $factory;
            single_process::registering_declares_every_other_instance_stopped,
            single_process::a_restart_recovers_the_previous_incarnation_at_once_p7_i5,
        );
    };
}

/// Expands the checks for adapters that implement [`crate::MultiProcess`].
#[macro_export]
macro_rules! storage_contract_multi_process_tests {
    ($factory:expr) => {
        $crate::__storage_contract_checks!(
            $factory;
            multi_process::two_processes_claim_each_task_once,
            multi_process::a_lease_that_ran_out_lets_another_process_recover_p7_i5,
            multi_process::commits_and_cancels_reach_the_other_process,
            multi_process::a_name_with_a_running_lease_is_in_use,
            multi_process::one_instance_leads_the_maintenance,
            multi_process::a_key_held_in_one_process_is_in_use_in_the_other_i8,
        );
    };
}

/// One test per listed check.
#[doc(hidden)]
#[macro_export]
macro_rules! __storage_contract_checks {
    ($factory:expr; $($module:ident :: $check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                $crate::$module::$check(&factory).await;
            }
        )*
    };
}
