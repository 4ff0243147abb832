"""What a run shows and writes: the text summary and tables (report), report.html (report_html,
report_figures), the output folder (emit), live progress (progress), the store's run history
(history, history_view) and the plan against the store (plan_status). Imports execute and below;
never search.
"""
