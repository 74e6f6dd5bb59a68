"""The attack x defense matrix (Chapter 7): every attack of the book against every defense.

``from fedlab.experiments import matrix as mx`` gives every public name of the package's modules:

* :mod:`fedlab.experiments.matrix.rows` -- the rows (:data:`~fedlab.experiments.matrix.rows.ATTACKS`), the threat
  model of every cell (its docstring), :func:`~fedlab.experiments.matrix.rows.run_row`,
  :func:`~fedlab.experiments.matrix.rows.run_matrix`; each row's code is in a private module per chapter
  (``_rows_gradient`` 1a, ``_rows_membership`` 1c, ``_rows_interaction`` 2-3c, ``_rows_reconstruction`` 4,
  ``_rows_secagg`` 6);
* :mod:`fedlab.experiments.matrix.layout` -- what a row is (:class:`~fedlab.experiments.matrix.layout.Attack`), its
  observers, the names of a record's cells;
* :mod:`fedlab.experiments.matrix.accounting` -- every epsilon the page reports (privacy-loss distribution);
* :mod:`fedlab.experiments.matrix.stats` -- advantage, significance and intervals read off a record;
* :mod:`fedlab.experiments.matrix.render` -- the page's HTML table and Markdown tables.

The columns are the library's defense registry, :mod:`fedlab.privacy.registry` (:class:`~fedlab.privacy.Defense`,
:data:`~fedlab.privacy.DEFENSES`, :func:`fedlab.privacy.apply`), re-exported here under the names the page uses.
"""
from ...privacy.registry import (DEFENSES, DP_SETTING, LDP_DELTA, USER_CONTRACT, USER_PUBLIC, Defense,
                                 dp_noise_multiplier, median_norm)
from .accounting import (ACCOUNTANT, central_epsilon, deployment_epsilons, describe_matrix, effective_epsilons,
                         ldp_epsilon, ldp_noise_ratio, safe_central_epsilon, safe_ldp_epsilon)
from .layout import (LOSS_SUFFIX, LOSS_TRUTH_SUFFIX, MALICIOUS_SERVER_DP_NA, NAIVE_NOTE, NAIVE_SUFFIX, NONNEG,
                     OBSERVERS, OUTSIDER, UNIT, Attack, value_name)
from ._rows_gradient import IMPRINT_TOL
from .render import (COLUMN_NOTES, UTILITY_ROW, adaptive_gap_table, live_table, own_defense_table, page_values,
                     render_html, row_threat_header, row_threats, threat_rows, utility_table)
from .rows import (ATTACKS, OUTSIDER_COLUMNS, OUTSIDER_ROWS, OUTSIDER_SAME, SECAGG_ATTACKS, SECAGG_COLUMNS,
                   SECAGG_CONSISTENT_SETTINGS, SECAGG_REFUSED_NOTE, SECAGG_ROW, SECAGG_ROWS, attacker, cell, run_matrix,
                   run_row)
from .stats import (NOT_SIGNIFICANT, adaptive_gaps, advantage, bounded_interval, cell_interval, consistent_with_record,
                    metric_range, optimum_verdict, record_table, undefended_advantage)

__all__ = ["optimum_verdict", "Defense", "USER_CONTRACT", "USER_PUBLIC", "attacker", "Attack", "DEFENSES", "ATTACKS", "DP_SETTING",
           "LDP_DELTA", "COLUMN_NOTES", "dp_noise_multiplier", "median_norm", "cell", "run_row", "run_matrix",
           "value_name", "describe_matrix", "threat_rows", "row_threats", "row_threat_header", "effective_epsilons",
           "undefended_advantage", "NOT_SIGNIFICANT", "MALICIOUS_SERVER_DP_NA", "OBSERVERS", "OUTSIDER",
           "OUTSIDER_ROWS", "OUTSIDER_COLUMNS", "OUTSIDER_SAME", "central_epsilon", "ldp_epsilon",
           "deployment_epsilons", "metric_range", "bounded_interval", "cell_interval", "adaptive_gaps",
           "adaptive_gap_table", "own_defense_table", "ACCOUNTANT", "NAIVE_SUFFIX", "NAIVE_NOTE", "LOSS_SUFFIX",
           "LOSS_TRUTH_SUFFIX", "page_values", "ldp_noise_ratio", "record_table", "advantage", "render_html",
           "consistent_with_record", "SECAGG_ROW", "SECAGG_ROWS", "SECAGG_ATTACKS", "SECAGG_COLUMNS",
           "SECAGG_CONSISTENT_SETTINGS", "SECAGG_REFUSED_NOTE", "safe_central_epsilon", "safe_ldp_epsilon",
           "UTILITY_ROW", "utility_table", "UNIT", "NONNEG", "IMPRINT_TOL", "live_table"]
