"""Helpers shared by the repository rules in 3rdparty/ (detect, validate, generate)."""

PYTHON_BIN_PATH = "PYTHON_BIN_PATH"

_BOOTSTRAP_HINT = "Run scripts/bootstrap.sh (it writes .bazelrc.user), or set PYTHON_BIN_PATH, e.g. `bazelisk build --repo_env=PYTHON_BIN_PATH=/path/to/venv/bin/python ...`."

def config_fail(rule_name, message):
    fail("\n[%s] %s\n" % (rule_name, message))

def find_python(repository_ctx, rule_name):
    """Returns the interpreter named by PYTHON_BIN_PATH, else python3 on PATH (absolute path)."""
    path = repository_ctx.os.environ.get(PYTHON_BIN_PATH, "").strip()
    if path:
        if not repository_ctx.path(path).exists:
            config_fail(rule_name, "PYTHON_BIN_PATH=%s does not exist. %s" % (path, _BOOTSTRAP_HINT))
        return path
    found = repository_ctx.which("python3")
    if not found:
        config_fail(rule_name, "no Python interpreter: PYTHON_BIN_PATH is unset and python3 is not on PATH. " + _BOOTSTRAP_HINT)
    return str(found)

def run_python_json(repository_ctx, rule_name, python, script):
    """Runs `script` with `python`; the script prints one JSON object on its last line."""
    result = repository_ctx.execute([python, "-c", script])
    if result.return_code != 0:
        config_fail(rule_name, "probing %s failed:\n%s%s\n%s" % (python, result.stdout, result.stderr, _BOOTSTRAP_HINT))
    return json.decode(result.stdout.strip().split("\n")[-1])

def write_failing_target(name, message):
    """BUILD text for a target that fails with `message` when built (and only then)."""
    return """
genrule(
    name = "{name}",
    outs = ["{name}.missing"],
    cmd = "echo '{message}' >&2; exit 1",
    visibility = ["//visibility:public"],
)
""".format(name = name, message = message.replace("'", ""))
