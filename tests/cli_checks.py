"""What every refusal must look like, for the tests of commands given bad input."""
from sim.cli import main


def refused(args: list[str], capsys, *needles: str) -> str:
    """Run `pdsim args`; it must exit 2 with one line holding every needle."""
    try:
        code = main(args)
    except SystemExit as e:  # a usage error, from argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err
