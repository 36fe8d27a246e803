"""The README's input -> behaviour catalogue (When something is wrong: what a run does), kept together as one
catalogue and grouped by the kind of bad input -- test_bad_configs (settings and CLI options), test_bad_checkpoints
(resume, checkpoint writes, --ckpt_path, kill -9), test_bad_policies (model/tokenizer paths, warm-start, n: 1),
test_bad_rewards (rewards that hang or fail), test_bad_data (prompts that do not fit) -- so a catalogue line is
found by what went wrong; the tests of each package's own code stay beside it (tests/<package>/)."""
