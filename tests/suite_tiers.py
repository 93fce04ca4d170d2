"""Which tests `make check` leaves out: those that start processes (the `slow` marker), and the one spawned run it
keeps (the `check` marker). tests/conftest.py marks the collected tests from these tables.

`make check` is the inner loop's tier (pytest -m "not slow or check"): every test that starts no process, plus one
spawned end-to-end run. `make test` runs every test, marked or not.

SLOW: a test that starts a process (ranks through `launch.spawn`, torchrun, NeMo-Run, the local Slurm, a CLI or a
helper subprocess: the evaluation's tokenizer probe, the loader's `cat` or `curl` for a pipe or http location),
directly or through a fixture. A module whose every test does is `ALL`; otherwise its tests are named (a
parametrized test by its function's name). A new test that starts a process goes here: in any run (`make test`
too) a test that is not marked and starts one fails, naming what it started. A test listed that no longer starts a
process only costs the fast tier a test. (A process started by a session-scoped fixture before the test's own set-up is
not seen.)

CHECK_RUN: the one spawned run of the fast tier: CLM then MLM on 2 ranks at TP=2 (megatron-core over gloo, the
packed corpus, checkpoints, TensorBoard), with the assertions that read it and start nothing more.
"""
ALL = "*"

CHECK_RUN = {
    "tests/train/test_training_run.py": (
        "test_losses_decrease_within_each_objective",
        "test_phase_switch_changes_objective_and_attention_but_carries_state",
        "test_each_step_reads_the_device_once",
        "test_checkpoints_follow_megatron_layout_and_keep_phase_end",
        "test_tensorboard_has_the_promised_tags",
        "test_tensorboard_names_the_run_and_gives_each_phase_its_own_run",
    ),
}

SLOW = {
    "tests/benchmarks/test_determinism_fork.py": ALL,
    "tests/benchmarks/test_gpu_deadlines.py": ALL,
    "tests/benchmarks/test_gpu_labels.py": (
        "test_the_sessions_trainer_refuses_local_layers_on_rows_too_long_for_their_mask",
    ),
    "tests/benchmarks/test_gpu_session.py": ALL,
    "tests/benchmarks/test_head_roofline.py": (
        "test_the_printed_line_names_the_default",
    ),
    "tests/cluster/test_slurm_detour.py": ALL,
    "tests/cluster/test_slurm_eval.py": ALL,
    "tests/cluster/test_slurm_failure.py": ALL,
    "tests/cluster/test_slurm_sweep.py": ALL,
    "tests/cluster/test_slurm_training.py": ALL,
    "tests/convert/test_convert_errors.py": (
        "test_an_export_onto_a_full_disk_names_the_file_and_the_os_words",
        "test_bad_checkpoints_are_refused_and_nothing_is_written",
        "test_bad_hf_sources_are_refused_and_nothing_is_written",
        "test_cli_exports_and_prints_a_summary",
        "test_clis_exit_non_zero_with_the_error_and_write_nothing",
        "test_existing_output_is_kept_unless_forced",
    ),
    "tests/convert/test_convert_llama.py": ALL,
    "tests/convert/test_convert_roundtrip.py": ALL,
    "tests/convert/test_convert_verify.py": ALL,
    "tests/convert/test_nonfinite_models.py": ALL,
    "tests/convert/test_output_modes.py": ALL,
    "tests/convert/test_outputs_apart_from_inputs.py": ALL,
    "tests/convert/test_remote_code_hooks.py": (
        "test_token_tables_and_files_without_hooks_are_left_byte_for_byte",
    ),
    "tests/convert/test_sentence_transformers_export.py": ALL,
    "tests/convert/test_weight_index.py": ALL,
    "tests/data/test_bounded_data_reads.py": (
        "test_a_command_that_never_writes_is_refused_after_the_stall_bound",
        "test_a_pipe_shard_is_bounded_the_same_way",
        "test_a_server_that_stalls_is_refused_after_the_stall_bound",
        "test_an_endless_pipe_manifest_stops_at_the_bound",
        "test_an_http_shard_far_larger_than_its_manifest_says_stops_at_the_bound",
    ),
    "tests/data/test_bounded_raw_inputs.py": (
        "test_prepare_data_takes_the_bound_and_refuses_in_one_line",
    ),
    "tests/data/test_credentials_from_environment.py": ALL,
    "tests/data/test_identity_cache.py": (
        "test_a_later_process_reads_the_same_identity_without_importing_transformers",
    ),
    "tests/data/test_embedded_tokenizer.py": (
        "test_embedded_tokenizer_roles_cache_and_race",
    ),
    "tests/data/test_hf_dataset_and_dtype.py": (
        "test_hf_dataset_errors_are_named",
        "test_hf_dataset_gives_the_same_shards_as_the_files",
    ),
    "tests/data/test_loader.py": (
        "test_pipe_url",
        "test_truncated_or_corrupt_shard_is_named",
    ),
    "tests/data/test_manifest_names.py": (
        "test_hostile_names_are_refused_before_anything_runs",
        "test_names_of_our_own_layouts_load_locally_through_pipe_and_http",
    ),
    "tests/data/test_partition.py": (
        "test_cli_partition_from_slurm_array",
        "test_merge_refuses_mismatched_or_damaged_parts",
    ),
    "tests/data/test_prepare_data.py": (
        "test_a_validation_split_the_corpus_cannot_give_is_refused_and_writes_nothing",
        "test_bad_inputs_give_clear_errors",
    ),
    "tests/data/test_random_length.py": (
        "test_same_samples_on_dp1_and_dp2_and_across_a_resume",
    ),
    "tests/eval/test_encodeval_parity.py": (
        "test_each_retrieval_set_is_scored_on_its_own_splits_and_corpus",
        "test_encodeval_token_score_is_the_mean_of_per_sentence_macro_f1",
        "test_qed_trains_one_epoch_while_squad_keeps_the_step_budget",
    ),
    "tests/eval/test_encodeval_rules.py": (
        "test_paper_grid_prints_encodevals_score_and_the_standard_one",
    ),
    "tests/eval/test_encodeval_scores.py": (
        "test_qa_f1_reproduces_the_released_per_question_scores_bit_for_bit",
    ),
    "tests/eval/test_encodeval_tc.py": (
        "test_our_tc_score_is_encodevals_in_every_sentence",
    ),
    "tests/eval/test_encodeval_training.py": (
        "test_a_step_is_the_mean_of_its_eight_micro_batch_token_means",
    ),
    "tests/eval/test_eval_cli.py": (
        "test_evaluate_cli_bad_task_file_fails_clearly",
        "test_evaluate_cli_grid_then_summary",
    ),
    "tests/eval/test_eval_compare_runs.py": (
        "test_compare_runs_cli_errors_on_missing_folder",
    ),
    "tests/eval/test_eval_console.py": ALL,
    "tests/eval/test_eval_data_efficiency_smoke.py": (
        "test_curve_over_checkpoints_with_injected_exporter",
        "test_run_smoke_evaluation_end_to_end",
    ),
    "tests/eval/test_eval_defects.py": (
        "test_cli_refuses_a_bad_tag_with_exit_2_before_training",
        "test_trivially_learnable_ner_scores_well_under_the_cli_smoke_protocol",
    ),
    "tests/eval/test_eval_paper_suite.py": (
        "test_validation_is_five_percent_of_train_as_datasets_splits_it",
    ),
    "tests/eval/test_eval_protocol.py": (
        "test_grid_rejects_non_model_directory",
        "test_grid_writes_runs_resumes_and_summarises",
        "test_stability_spread_and_diverged_fraction",
    ),
    "tests/eval/test_eval_units.py": (
        "test_a_re_export_into_the_same_directory_is_not_reused",
    ),
    "tests/eval/test_finetune_device.py": (
        "test_device_cuda_without_a_gpu_is_refused_in_one_line",
    ),
    "tests/eval/test_grid_claims.py": (
        "test_a_stale_claim_is_taken_over_exactly_once_and_a_beating_one_never",
        "test_processes_racing_for_units_claim_each_exactly_once",
        "test_the_claim_of_a_process_of_this_host_that_is_gone_is_taken_at_once",
    ),
    "tests/eval/test_grid_status.py": (
        "test_a_failed_unit_is_recorded_the_others_finish_and_a_later_command_runs_it_once_more",
        "test_list_prices_the_suite_per_model_in_gpu_hours_and_wall_time",
        "test_status_says_which_worker_runs_what_since_when_and_what_is_left",
    ),
    "tests/eval/test_grid_spawn.py": (
        "test_a_refused_command_leaves_no_early_worker_running",
        "test_a_worker_handed_no_work_ends_quietly",
        "test_early_workers_a_command_did_not_use_are_killed_as_it_exits",
    ),
    "tests/eval/test_grid_workers.py": ALL,
    "tests/eval/test_hostile_eval_data.py": (
        "test_a_manifest_of_the_wrong_shape_is_one_line_and_exit_2",
    ),
    "tests/eval/test_hostile_eval_files.py": (
        "test_a_fifo_run_record_or_model_file_is_refused_before_any_run",
        "test_a_model_label_too_long_for_a_file_name_is_refused_before_any_fine_tuning",
        "test_a_record_is_not_reused_after_its_data_changed",
        "test_curve_refuses_a_fifo_train_state_at_once",
        "test_summary_over_a_bad_run_json_is_one_line_naming_it_and_exit_2",
    ),
    "tests/eval/test_output_paths.py": (
        "test_a_label_and_a_task_named_dotdot_cannot_write_outside_the_output",
    ),
    "tests/eval/test_paper_report.py": (
        "test_distance_from_the_paper_where_a_reference_exists",
        "test_distance_from_the_released_runs",
        "test_duplicate_run_across_folders_is_an_error",
        "test_existing_report_is_not_overwritten_without_force",
        "test_figures_from_a_synthetic_paper_grid",
        "test_main_table_matches_hand_computed_means_and_cis",
        "test_malformed_run_json_exits_2_naming_path_and_field",
        "test_missing_results_exit_2",
        "test_null_scores_and_losses_read_as_failed_runs",
        "test_only_runs_under_encodevals_rules_are_compared_with_the_paper",
        "test_paper_names_come_from_the_grid",
        "test_report_files_carry_the_table",
    ),
    "tests/eval/test_paper_sources.py": (
        "test_all_13_tasks_run_from_the_fetched_folder_and_records_carry_their_sources",
        "test_nq_halves_are_seeded_and_say_they_are_not_encodevals_draw",
        "test_warmup_counts_steps_as_the_trainer_counts_a_warmup_ratio",
    ),
    "tests/eval/test_seed_report.py": (
        "test_a_mask_schedule_variant_at_the_same_split_gets_its_own_line",
        "test_bad_pretraining_json_is_refused_and_nothing_written",
        "test_columns_are_means_and_cis_over_pretraining_seeds",
        "test_report_writes_the_seed_table_and_figures",
    ),
    "tests/eval/test_sentence_transformers_retriever.py": (
        "test_kept_retriever_reproduces_its_recorded_ndcg_through_sentence_transformers",
    ),
    "tests/model/test_chunked_head.py": (
        "test_fused_path_returns_megatrons_dummy_and_makes_no_vocab_sized_copies",
        "test_fused_weight_gradient_equals_megatrons_fused_head_in_fp32",
        "test_the_training_step_accumulates_the_chunked_heads_weight_gradient_in_fp32",
    ),
    "tests/model/test_document_attention.py": (
        "test_packed_documents_equal_each_document_alone",
    ),
    "tests/model/test_hf_parity.py": ALL,
    "tests/model/test_modernbert_counts.py": (
        "test_modernbert_presets_are_transformers_shapes_and_the_plan_counts_their_parameters",
    ),
    "tests/model/test_modernbert_layouts.py": ALL,
    "tests/model/test_modernbert_parity.py": ALL,
    "tests/model/test_modernbert_te_spec.py": ALL,
    "tests/model/test_parallel_equivalence.py": ALL,
    "tests/model/test_rope_switch.py": ALL,
    "tests/model/test_sample_attention.py": (
        "test_each_sample_through_forward_backward_equals_the_sample_alone",
        "test_losses_and_gradients_do_not_depend_on_how_the_padding_is_cut",
    ),
    "tests/model/test_te_stand_in_contracts.py": (
        "test_megatrons_te_spec_trains_with_gradient_accumulation_fusion",
    ),
    "tests/parallel/test_cpu_emulation.py": ALL,
    "tests/parallel/test_rendezvous.py": ALL,
    "tests/parallel/test_torchrun_exit_codes.py": (
        "test_the_agent_passes_a_refusal_on_as_2_and_anything_mixed_as_a_failure",
        "test_the_images_torchrun_is_our_agent",
        "test_the_requeue_policy_never_requeues_a_refusal_and_requeues_a_crash_as_allowed",
    ),
    "tests/recipes/test_data_prep_recipe.py": ALL,
    "tests/recipes/test_detour_downstream.py": (
        "test_the_family_on_slurm_is_one_dependency_chain",  # NeMo-Run's `mkdir -p` for each job's folder
        "test_the_report_puts_the_held_out_loss_beside_each_tasks_mean_and_ci_over_seeds",  # git rev-parse
    ),
    "tests/recipes/test_driver_imports.py": ALL,
    "tests/recipes/test_detour_recipe.py": (
        "test_detour_refusals_are_one_line",
        "test_the_family_is_listed_and_runs_from_python_m_recipes",
        "test_tiny_detour_and_control_run_export_and_report",
    ),
    "tests/recipes/test_mini_replication.py": ALL,
    "tests/recipes/test_phase_plan_recipe.py": ALL,
    "tests/recipes/test_rank_task.py": (
        "test_the_rank_refuses_a_bad_or_oversized_task_in_one_line_before_importing_the_trainer",
    ),
    "tests/recipes/test_recipes_chain.py": ALL,
    "tests/recipes/test_recipes_cli_overrides.py": (
        "test_slurm_needs_an_account",
        "test_the_executor_is_sized_by_the_recipe",
    ),
    "tests/recipes/test_recipes_ctrl_c.py": ALL,
    "tests/recipes/test_recipes_data_guard.py": (
        "test_a_users_directory_is_never_written_into",
        "test_missing_data_path_is_refused_not_prepared",
    ),
    "tests/recipes/test_recipes_eval.py": ALL,
    "tests/recipes/test_recipes_local_run.py": ALL,
    "tests/recipes/test_recipes_names.py": ALL,
    "tests/recipes/test_recipes_paper_grid.py": (
        "test_each_grid_run_builds_with_its_released_name_and_settings",
        "test_overrides_written_after_only_patterns_are_overrides_not_patterns",
        "test_paper_grid_is_the_papers_38_runs",
        "test_slurm_branches_depend_on_the_segment_that_writes_their_checkpoint",
        "test_slurm_cpt_jobs_depend_on_their_decayed_parent",
        "test_slurm_dryrun_of_the_whole_paper_grid",
    ),
    "tests/recipes/test_recipes_preempted.py": (
        "test_a_preempted_task_is_reported_as_such",
    ),
    "tests/recipes/test_recipes_quiet.py": ALL,
    "tests/recipes/test_recipes_refusals.py": ALL,
    "tests/recipes/test_recipes_registry.py": (
        "test_a_recipes_help_lists_its_parameters_with_types_and_defaults",
    ),
    "tests/recipes/test_recipes_slurm_dryrun.py": ALL,
    "tests/recipes/test_recipes_sweep_eval.py": ALL,
    "tests/test_cpu_kernels.py": (
        "test_pin_keeps_a_value_the_user_set",
        "test_pin_makes_mkl_multiply_on_its_vendor_independent_branch",
        "test_pin_makes_torch_use_avx2_kernels",
        "test_the_demo_pins_before_anything_imports_torch",
    ),
    "tests/test_demo.py": (
        "test_demo_pipeline_runs_end_to_end",
    ),
    "tests/test_demo_figures.py": (
        "test_a_figure_outside_the_spread_fails_on_another_host_naming_only_it",
        "test_another_host_needs_the_reference_and_it_must_be_the_readmes",
        "test_check_fails_on_other_numbers_and_write_fixes_it",
        "test_intel_and_amd_figures_pass_each_others_readme_within_the_spread",
        "test_the_block_names_its_host_and_a_failed_check_names_both",
        "test_the_repository_readme_passes_on_the_amd_host_or_names_only_figures_outside_the_spread",
    ),
    "tests/test_make_help.py": ALL,
    "tests/test_megatron_jit.py": (
        "test_importing_megatron_through_us_leaves_the_compiler_stack_unimported",
    ),
    "tests/test_pickled_weights.py": (
        "test_the_tools_refuse_it_in_one_line_and_exit_2",
    ),
    "tests/test_readme_commands.py": (
        "test_a_documented_command_runs_as_written",
    ),
    "tests/test_suite_groups.py": (
        "test_each_shared_fixtures_files_and_each_file_run_on_one_worker",
    ),
    "tests/test_tokenizer_probe.py": ALL,
    "tests/tools/test_shrink_te_core.py": ALL,
    "tests/train/test_branch.py": ALL,
    "tests/train/test_checkpoint_guard.py": (
        "test_a_foreign_checkpoint_cannot_block_or_exhaust_a_rank",
        "test_a_legacy_common_file_is_refused",
        "test_convert_to_hf_and_verify_refuse_hostile_checkpoints",
        "test_hostile_metadata_is_refused_by_torch_dcp_reader_itself",
        "test_legitimate_metadata_reads_as_pickle_reads_it",
        "test_resume_and_init_from_refuse_hostile_checkpoints_and_write_nothing",
        "test_verify_logits_loader_refuses_a_hostile_checkpoint",
    ),
    "tests/train/test_checkpoint_keys.py": ALL,
    "tests/train/test_document_attention_run.py": ALL,
    "tests/train/test_fused_adam_resume.py": ALL,
    "tests/train/test_mask_schedule_run.py": ALL,
    "tests/train/test_nonfinite_weights.py": ALL,
    "tests/train/test_phase_data_run.py": ALL,
    "tests/train/test_preemption.py": ALL,
    "tests/train/test_prefetch.py": (
        "test_a_preemption_writes_its_status_at_once_while_a_shard_read_is_stalled",
        "test_the_next_batch_is_built_during_the_step_and_a_stop_resumes_exactly",
    ),
    "tests/train/test_random_length_run.py": (
        "test_a_pipeline_parallel_resume_continues_with_the_same_samples_and_validation",
        "test_clm_only_and_mlm_only_runs_report_both_validation_losses",
        "test_dp1_and_a_resumed_dp2_run_reproduce_training_and_validation",
        "test_tokens_are_the_samples_real_tokens_and_validation_is_logged",
    ),
    "tests/train/test_resume_rules.py": (
        "test_a_live_writer_on_this_host_keeps_the_directory",
        "test_a_lock_from_another_host_is_stale_only_when_requeued_or_silent",
    ),
    "tests/train/test_run_lock.py": (
        "test_of_two_starts_at_once_exactly_one_takes_the_lock_free_or_stale",
        "test_only_its_holder_releases_the_lock",
    ),
    "tests/train/test_save_errors.py": ALL,
    "tests/train/test_schedule_restarts.py": (
        "test_the_switch_keeps_adams_moments_and_step_count",
    ),
    "tests/train/test_te_layer_spec_run.py": ALL,
    "tests/train/test_train_cli.py": (
        "test_a_credential_in_the_data_location_is_used_but_never_recorded",
        "test_a_non_empty_folder_that_holds_no_run_of_ours_is_refused",
        "test_a_yaml_alias_bomb_is_refused_at_once",
        "test_invalid_config_exits_2_naming_the_problem",
        "test_special_ids_outside_the_vocabulary_stop_the_run_at_its_start",
        "test_torchrun_entry_trains_with_overrides",
    ),
    "tests/train/test_training_bf16.py": ALL,
    "tests/train/test_training_run.py": ALL,
}

# `make test` runs the suite on two pytest-xdist workers: the tests of one file always share a worker (its
# module-scoped runs are made once), and so do all the files whose tests use one of these session-scoped fixtures,
# each a spawned run worth paying once: the local Slurm with every scenario launched together, NeMo-Run's
# uninterrupted tiny run, the 4-rank TP2 x PP2 checkpoint. The cheap session fixtures (prepared corpora, tiny HF
# models) are made once per worker instead. xdist's controller sees test ids, not fixtures: the files are listed
# (a path ending in "/": every file under it), and tests/conftest.py refuses a test that uses one of these fixtures
# from a file not listed with it (tests/suite_groups.py).
SHARED_FIXTURE_FILES = {
    "slurm_cluster": ("tests/cluster/",),
    "uninterrupted_tiny_run": ("tests/recipes/test_recipes_ctrl_c.py", "tests/recipes/test_recipes_local_run.py",
                               "tests/recipes/test_recipes_refusals.py"),
    "tp2pp2_run": ("tests/convert/test_convert_errors.py", "tests/convert/test_convert_roundtrip.py",
                   "tests/convert/test_convert_verify.py", "tests/convert/test_outputs_apart_from_inputs.py"),
}

# The groups that start first, longest first (each the worker's seconds in a clean-clone `make test`,
# docs/performance.md): a long group dealt out last would leave the other worker idle at the end.
LONGEST_FIRST = (
    "slurm_cluster",  # every tests/cluster file: ~600 s
    "tests/recipes/test_recipes_sweep_eval.py",
    "tests/benchmarks/test_gpu_session.py",
    "tests/recipes/test_mini_replication.py",
    "tests/recipes/test_detour_recipe.py",
    "uninterrupted_tiny_run",
    "tests/train/test_preemption.py",
    "tests/train/test_training_run.py",
    "tests/test_demo.py",
    "tests/benchmarks/test_gpu_deadlines.py",
    "tests/train/test_train_cli.py",
    "tests/train/test_fused_adam_resume.py",
    "tests/eval/test_grid_workers.py",
    "tests/train/test_branch.py",
)
