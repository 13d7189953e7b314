"""One exception tree in one module (``controller.errors``), drawn in its docstring.

The drawing is compared with the classes, and every module of the project is imported to find
exception classes defined anywhere else: a second tree (or a stray ``class FooError(ValueError)``)
fails here with its module named.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import textwrap

import controller
import policies
import providers
from controller import errors

PACKAGES = (controller, policies, providers)


def _all_modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + ".")]
    return sorted(names)


def test_the_docstring_draws_the_tree_the_classes_form() -> None:
    assert textwrap.indent(errors.render_tree(), "    ") in (errors.__doc__ or "")


def test_every_public_exception_of_the_project_is_in_the_tree() -> None:
    stray = []
    for name in _all_modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if not (inspect.isclass(obj) and issubclass(obj, BaseException)):
                continue
            if obj.__module__ == name and name != errors.__name__ and not obj.__name__.startswith("_"):
                stray.append(f"{name}.{obj.__name__}")
            if obj.__module__ == errors.__name__ and obj is not errors.TidegateError:
                assert issubclass(obj, errors.TidegateError), obj
    assert stray == [], "exceptions defined outside controller.errors: " + ", ".join(stray)


def test_the_old_import_paths_name_the_same_classes() -> None:
    from controller.bundle import BundleError
    from controller.db.migrate import SchemaNotCurrentError
    from controller.db.preflight import DatabaseError
    from controller.protocols import PermanentProviderError, ProviderError, TransientProviderError
    from controller.runtime import AddressUnavailable, ConfigError
    from controller.sim.scenario import ScenarioError
    from policies.base import UnknownPolicyKind
    from policies.cron import CronError
    from providers.kubernetes import ConflictError

    moved = [BundleError, SchemaNotCurrentError, DatabaseError, PermanentProviderError, ProviderError,
             TransientProviderError, AddressUnavailable, ConfigError, ScenarioError, UnknownPolicyKind,
             CronError, ConflictError]
    assert [getattr(errors, c.__name__) for c in moved] == moved


def test_a_bad_cron_expression_is_a_user_error_and_still_a_value_error() -> None:
    from policies.cron import parse_cron

    for caught in (errors.UserError, ValueError):
        try:
            parse_cron("61 * * * *")
        except caught as e:
            assert "61" in str(e)
        else:
            raise AssertionError("parse_cron accepted minute 61")
