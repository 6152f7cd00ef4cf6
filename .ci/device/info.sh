# first call: what the machine has
uname -m; python3 -V; python3 -c 'import platform; print(platform.libc_ver())'
which g++ c++ gcc ninja xz tar; g++ --version | head -1
python3 -c 'import jax; print(jax.__version__, jax.devices())'
python3 -m pip list 2>/dev/null | grep -iE "^(numpy|scipy|sympy|typing|packaging|filelock|jinja|networkx|fsspec|pytest|hypothesis|setuptools|ml.dtypes) "
df -h /tmp | tail -1; nproc; echo "PYTHONPATH=$PYTHONPATH"
