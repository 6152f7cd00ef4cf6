# The test subset on the chip, most important files first, one line per test (-v): a run stopped at its
# limit, or a Mosaic abort that ends the process, still leaves each finished test's outcome in the log.
. .ci/device/setup.sh || exit 1
LIMIT=${LIMIT:-520}
FILES=${FILES:-"tests/test_backend_core.py tests/test_pallas.py tests/test_train_step.py tests/test_amp_optim.py
  tests/test_fusion.py tests/test_accelerator.py tests/test_compile.py tests/test_transformers.py tests/test_trainer.py
  tests/test_ops_attention.py tests/test_ops_nn.py tests/test_ops_conv.py tests/test_views_inplace.py
  tests/test_ops_elementwise.py tests/test_ops_reductions.py tests/test_errors.py"}
python3 -c "import tpu_interactive as tt, torch; print(torch.__version__, tt.backend_info())" 2>&1 | tee $OUT/info.log
timeout -s INT -k 60 $LIMIT python3 -m pytest -k "not notebook" -p no:cacheprovider -o addopts= -m "not slow and not browser" --timeout 150 \
  -v -rfE --durations=20 --junitxml=$OUT/junit.xml $EXTRA $FILES 2>&1 | tee $OUT/tests.log | grep -vE "^(tests/|\.|PASSED)" | tail -150
